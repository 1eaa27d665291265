"""``chorus bench shared-prefix``: shared-prefix ("cascade") decode attention on a CUDA GPU.

Turbo shapes: 16 heads x 64, bf16, block size 16, one layer's decode attention. Rows
1/8/64/256 share a voice prompt of 0/34/400 tokens (prefix caching shares its *full* blocks:
0/2/25 of them), then have 30-130 tokens of their own. Each case times plain Triton paged
attention and the same call with the planner's shared-prefix plan: medians of CUDA-graph
replays (falling back to eager launches if capture fails), the graph calling the kernels once
per input set, the sets rotating over enough KV to defeat the L2 (a real step's layers each
read their own KV). Also: the max abs difference between the two outputs, the relative error
of both against the fp32 PyTorch reference, the planner's host time, and, at 256 rows with a
400-token prefix (unless ``quick``), a sweep of the prefix kernel's launch knobs. Each case is
guarded: one that fails is recorded with its error and the run goes on (docs/engine.md,
"Shared-prefix attention").
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import torch

from chorus.bench.cuda_timing import median_cuda_ms
from chorus.bench.report import write_report
from chorus.engine.attention import SharedPrefixTensors, paged_attention_reference, plan_shared_prefixes
from chorus.engine.attention.triton_paged import paged_attention_triton

HEADS, HEAD_DIM, BLOCK = 16, 64, 16
DTYPE = torch.bfloat16
ROTATE_BYTES = 256 << 20
MAX_SETS = 32


def make_set(rows: int, prefix: int, seed: int) -> dict:
    """One batch: ``rows`` decode rows sharing ``prefix // BLOCK`` full blocks, then their own."""
    gen = torch.Generator().manual_seed(seed)
    suffix = torch.randint(30, 131, (rows,), generator=gen)
    seq_lens = prefix + suffix
    shared = prefix // BLOCK
    need = (-(-seq_lens // BLOCK)).tolist()
    num_blocks = shared + sum(n - shared for n in need) + 1
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(rows, max(need) + 2, dtype=torch.int32)
    used = shared
    for r, n in enumerate(need):
        table[r, :shared] = perm[:shared]
        table[r, shared:n] = perm[used:used + n - shared]
        used += n - shared
    kv = lambda: torch.randn(num_blocks, BLOCK, HEADS, HEAD_DIM, generator=gen).to(DTYPE)  # noqa: E731
    return dict(
        q=torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(DTYPE).cuda(),
        key_cache=kv().cuda(), value_cache=kv().cuda(), block_tables=table.cuda(),
        seq_lens=seq_lens.to(torch.int32).cuda(),
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32).cuda(),
        table_np=table.numpy(), lens_np=seq_lens.to(torch.int32).numpy(),
        max_seq_len=int(seq_lens.max()), kv_bytes=2 * num_blocks * BLOCK * HEADS * HEAD_DIM * 2,
    )


def attend(s: dict, out: torch.Tensor, shared: SharedPrefixTensors | None, **kw) -> None:
    paged_attention_triton(
        s["q"], s["key_cache"], s["value_cache"], s["block_tables"], s["seq_lens"],
        s["query_start_loc"], HEAD_DIM ** -0.5, max_query_len=1, num_decodes=s["q"].shape[0],
        max_seq_len=s["max_seq_len"], out=out, shared_prefix=shared, **kw)


def time_calls(calls, iters: int) -> tuple[float, str]:
    """Median ms of one call of ``calls`` (a list of thunks run in turn)."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in calls:
                fn()
        run, mode = graph.replay, "graph"
    except Exception:  # noqa: BLE001 - keep measuring eagerly
        torch.cuda.synchronize()
        run, mode = (lambda: [fn() for fn in calls]), "eager"
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    return median_cuda_ms(run, iters) / len(calls), mode


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def bench_case(rows: int, prefix: int, iters: int, sweep: bool) -> dict:
    first = make_set(rows, prefix, seed=rows * 1000 + prefix)
    n_sets = max(1, min(MAX_SETS, -(-ROTATE_BYTES // first["kv_bytes"])))
    sets = [first] + [make_set(rows, prefix, seed=rows * 1000 + prefix + i) for i in range(1, n_sets)]

    t0 = time.perf_counter()
    plans = [plan_shared_prefixes(s["table_np"], s["lens_np"], rows, BLOCK) for s in sets]
    plan_us = (time.perf_counter() - t0) / len(sets) * 1e6
    max_groups = max(1, max(p.num_groups for p in plans))
    shared = [SharedPrefixTensors.from_plan(p, "cuda", max_groups) for p in plans]
    outs_plain = [torch.empty_like(s["q"]) for s in sets]
    outs_shared = [torch.empty_like(s["q"]) for s in sets]

    # correctness first (set 0)
    attend(first, outs_plain[0], None)
    attend(first, outs_shared[0], shared[0])
    torch.cuda.synchronize()
    # in fp32 from the same bf16 inputs: both kernels' errors are then their own, not a shared rounding
    ref = paged_attention_reference(first["q"].float(), first["key_cache"].float(), first["value_cache"].float(),
                                    first["block_tables"], first["seq_lens"],
                                    first["query_start_loc"], HEAD_DIM ** -0.5)
    result = dict(
        rows=rows, prefix_tokens=prefix, shared_prefix_tokens=int(plans[0].prefix_len.max()),
        num_groups=plans[0].num_groups, kv_sets=n_sets, plan_host_us=round(plan_us, 1),
        max_abs_diff=float((outs_shared[0].float() - outs_plain[0].float()).abs().max()),
        rel_err_plain=rel_error(outs_plain[0], ref), rel_err_shared=rel_error(outs_shared[0], ref),
    )
    ms_plain, mode = time_calls([lambda s=s, o=o: attend(s, o, None)
                                 for s, o in zip(sets, outs_plain)], iters)
    ms_shared, _ = time_calls([lambda s=s, o=o, p=p: attend(s, o, p)
                               for s, o, p in zip(sets, outs_shared, shared)], iters)
    result.update(ms_plain=ms_plain, ms_shared=ms_shared, speedup=ms_plain / ms_shared,
                  timing=mode)
    if sweep:
        result["sweep"] = []
        for block_g in (16, 32, 64, 128):
            for splits in (1, 2, 4, 8):
                try:
                    kw = dict(block_g=block_g, prefix_splits=splits)
                    ms, _ = time_calls([lambda s=s, o=o, p=p: _attend_tuned(s, o, p, kw)
                                        for s, o, p in zip(sets, outs_shared, shared)], iters)
                    result["sweep"].append(dict(block_g=block_g, prefix_splits=splits, ms=ms))
                except Exception as exc:  # noqa: BLE001
                    result["sweep"].append(dict(block_g=block_g, prefix_splits=splits,
                                                error=repr(exc)[:300]))
    return result


def _attend_tuned(s: dict, out: torch.Tensor, shared: SharedPrefixTensors, kw: dict) -> None:
    from chorus.engine.attention.triton_shared_prefix import shared_prefix_decode_triton

    shared_prefix_decode_triton(
        s["q"], s["key_cache"], s["value_cache"], s["block_tables"], s["seq_lens"],
        s["query_start_loc"], HEAD_DIM ** -0.5, shared, num_decodes=s["q"].shape[0],
        max_seq_len=s["max_seq_len"], out=out, **kw)


def run(quick: bool = False) -> dict:
    """Every case (rows x prefix tokens), each printed as a JSON line to stderr as it ends."""
    if not torch.cuda.is_available():
        raise ValueError("chorus bench shared-prefix needs a CUDA device")
    import triton  # an ImportError names the missing package

    report = dict(benchmark="shared_prefix", device_name=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, heads=HEADS, head_dim=HEAD_DIM, block_size=BLOCK, dtype=str(DTYPE),
                  cases=[])
    iters = 20 if quick else 100
    for rows in (1, 8, 64, 256):
        for prefix in (0, 34, 400):
            t0 = time.perf_counter()
            try:
                case = bench_case(rows, prefix, iters, sweep=not quick and rows == 256 and prefix == 400)
            except Exception as exc:  # noqa: BLE001 - record and go on
                case = dict(rows=rows, prefix_tokens=prefix, error=repr(exc)[:500],
                            traceback=traceback.format_exc()[-2000:])
            case["wall_s"] = round(time.perf_counter() - t0, 1)
            report["cases"].append(case)
            print(json.dumps({k: v for k, v in case.items() if k not in ("sweep", "traceback")}), file=sys.stderr,
                  flush=True)
            torch.cuda.empty_cache()
    return report


def main_json(quick: bool, out: str | None) -> dict:
    """Run, print the JSON report to stdout (and write it to ``out``, atomically)."""
    report = run(quick)
    write_report(report, out)
    return report
