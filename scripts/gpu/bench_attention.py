"""Micro-benchmark of the paged attention kernels on a CUDA GPU; writes JSON to --out.

    python scripts/gpu/bench_attention.py --out results/attention.json [--quick] [--decode-only]
        [--batches 1,8,64,256,512] [--contexts 400,800,1400]

T3 shapes: 16 heads x 64, bf16, block size 16, one layer's call. Decode at batch
1/8/64/256/512 and contexts 400/800/1400 (by default), each sequence's blocks scattered over the pool.
Every timing is the median of CUDA-graph replays whose graph calls the kernel once per input
set, the sets rotating over enough KV to defeat the 60 MB L2 (every layer of a real step reads
its own KV, so the cache is cold). GB/s counts the K and V bytes of the contexts, read once.
Each decode shape times the default launch plan and a sweep (tile x loop stages, KV splits,
warps; a plan too big for shared memory is recorded as skipped), and torch SDPA over the same KV made contiguous, as a yardstick. A few prefill/mixed
batches and the KV write are timed too (not with ``--decode-only``). Every kernel output is checked against the PyTorch
reference first (bf16 bound 1e-2).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chorus.engine.attention import paged_attention_reference  # noqa: E402
from chorus.engine.attention.launch_plan import choose_num_splits, num_sms  # noqa: E402
from chorus.engine.attention.triton_paged import paged_attention_triton, write_kv_triton  # noqa: E402

HEADS, HEAD_DIM, BLOCK = 16, 64, 16
DTYPE = torch.bfloat16
ROTATE_BYTES = 512 << 20


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm())


def graph_time_us(calls: list, reps: int) -> float:
    """Median per-call time of graph replays that run every callable in ``calls`` once."""
    for call in calls:  # compile and warm up outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    del graph
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbps() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_time_us([lambda: dst.copy_(src)], reps=20)
    return 2 * src.numel() / us / 1e3


class Batch:
    """``sets`` copies of one batch shape, each over its own blocks of one shared pool."""

    def __init__(self, specs: list[tuple[int, int]], seed: int = 0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.specs = specs
        self.seq_lens = torch.tensor([n for n, _ in specs], dtype=torch.int32, device="cuda")
        q_lens = [q for _, q in specs]
        self.max_query_len = max(q_lens)
        self.max_seq_len = max(n for n, _ in specs)
        self.query_start_loc = torch.tensor([0] + q_lens, device="cuda").cumsum(0).to(torch.int32)
        self.n_tokens = sum(q_lens)
        need = [math.ceil(n / BLOCK) for n, _ in specs]
        per_set = sum(need)
        self.kv_bytes = 2 * sum(n for n, _ in specs) * HEADS * HEAD_DIM * DTYPE.itemsize
        self.sets = max(1, min(256, math.ceil(ROTATE_BYTES / self.kv_bytes)))
        num_blocks = per_set * self.sets
        shape = (num_blocks, BLOCK, HEADS, HEAD_DIM)
        self.key_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
        self.value_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
        order = torch.randperm(num_blocks, generator=gen, device="cuda").to(torch.int32)
        self.tables = []
        for s in range(self.sets):
            table = torch.zeros(len(specs), max(need), dtype=torch.int32, device="cuda")
            used = s * per_set
            for row, count in enumerate(need):
                table[row, :count] = order[used:used + count]
                used += count
            self.tables.append(table)
        self.q = torch.randn(self.n_tokens, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
        self.out = torch.empty_like(self.q)
        self.scale = HEAD_DIM ** -0.5

    def args(self, s: int) -> tuple:
        return (self.q, self.key_cache, self.value_cache, self.tables[s], self.seq_lens,
                self.query_start_loc, self.scale)

    def flops(self) -> float:
        """2 matmuls x 2 flops per visible (query, key) pair, per head and dim."""
        pairs = sum(q * (n - q) + q * (q + 1) // 2 for n, q in self.specs)
        return 4.0 * pairs * HEADS * HEAD_DIM

    def kernel_calls(self, **kw) -> list:
        kw.setdefault("max_query_len", self.max_query_len)
        kw.setdefault("max_seq_len", self.max_seq_len)
        return [lambda s=s: paged_attention_triton(*self.args(s), out=self.out, **kw)
                for s in range(self.sets)]

    def check(self, **kw) -> float:
        self.out.fill_(float("nan"))
        self.kernel_calls(**kw)[0]()
        return rel_error(self.out, paged_attention_reference(*self.args(0)))

    def sdpa_calls(self) -> list:
        """Dense decode SDPA over the same KV gathered contiguous (decode shapes only)."""
        assert self.max_query_len == 1 and len({n for n, _ in self.specs}) == 1
        ctx = self.specs[0][0]
        q = self.q[:, :, None, :]                                         # [B, H, 1, D]
        calls, self._dense = [], []
        for s in range(min(self.sets, max(1, ROTATE_BYTES // self.kv_bytes))):
            blocks = self.tables[s].long()
            k = self.key_cache[blocks].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
            v = self.value_cache[blocks].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
            self._dense.append((k, v))
            calls.append(lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v))
        return calls


def record(rows: list, timed: Batch, name: str, calls: list, reps: int, **extra) -> dict:
    us = graph_time_us(calls, reps)
    row = {"case": name, "us": round(us, 2), "GBps": round(timed.kv_bytes / us / 1e3, 1), **extra}
    rows.append(row)
    return row


def bench_decode(rows: list, batch_size: int, ctx: int, copy_gbps: float, quick: bool) -> None:
    batch = Batch([(ctx, 1)] * batch_size)
    reps = 30
    base = {"kind": "decode", "batch": batch_size, "ctx": ctx}
    splits = choose_num_splits(batch_size * HEADS, math.ceil(ctx / 64), num_sms(torch.device("cuda")))
    err = batch.check()
    row = record(rows, batch, "default", batch.kernel_calls(), reps, **base, splits=splits,
                 rel_err=err, ok=err < 1e-2)
    row["frac_of_copy_bw"] = round(row["GBps"] / copy_gbps, 3)
    sweep = []
    for tile in (32, 64, 128):
        for stages in ((1, 3) if quick else (1, 2, 3, 4)):
            sweep.append(dict(decode_tile=tile, decode_stages=stages))
    for n in (1, 2, 4, 8, 16):
        sweep.append(dict(num_splits=n))
    if not quick:
        sweep += [dict(decode_warps=2), dict(decode_warps=8), dict(decode_tile=128, decode_warps=8)]
    for kw in sweep:
        try:
            err = batch.check(**kw)
        except triton.runtime.errors.OutOfResources as exc:  # a plan too big for this GPU
            rows.append({"case": "sweep", **base, **kw, "skipped": str(exc)[:200]})
            continue
        record(rows, batch, "sweep", batch.kernel_calls(**kw), reps, **base, **kw, rel_err=err,
               ok=err < 1e-2)
    if batch_size * ctx * HEADS * HEAD_DIM * 2 * 2 < (4 << 30):
        record(rows, batch, "sdpa_contiguous", batch.sdpa_calls(), reps, **base)
    del batch
    torch.cuda.empty_cache()


def bench_mixed(rows: list, name: str, specs: list, num_decodes: int = 0) -> None:
    batch = Batch(specs)
    err = batch.check(num_decodes=num_decodes)
    row = record(rows, batch, name, batch.kernel_calls(num_decodes=num_decodes), 30,
                 kind="mixed", tokens=batch.n_tokens, seqs=len(specs), num_decodes=num_decodes,
                 rel_err=err, ok=err < 1e-2)
    row["TFLOPs"] = round(batch.flops() / row["us"] / 1e6, 1)
    del batch
    torch.cuda.empty_cache()


def bench_write(rows: list, tokens: int) -> None:
    num_blocks = 4096
    cache_shape = (num_blocks, BLOCK, HEADS, HEAD_DIM)
    kc = torch.randn(cache_shape, device="cuda", dtype=DTYPE)
    vc = torch.randn(cache_shape, device="cuda", dtype=DTYPE)
    k = torch.randn(tokens, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * BLOCK, device="cuda")[:tokens]
    us = graph_time_us([lambda: write_kv_triton(kc, vc, k, v, slots)], reps=50)
    moved = 4 * k.numel() * k.element_size()  # read k, v; write both
    rows.append({"kind": "write_kv", "case": "write_kv", "tokens": tokens, "us": round(us, 2),
                 "GBps": round(moved / us / 1e3, 1)})


def bench_prefill_and_write(rows: list) -> None:
    bench_mixed(rows, "prefill 1x400", [(400, 400)])
    bench_mixed(rows, "prefill 8x400", [(400, 400)] * 8)
    bench_mixed(rows, "chunk 256 after 800", [(1056, 256)] * 4)
    for nd in (0, 64):
        bench_mixed(rows, f"mixed 64 decode ctx 800 + 400 prefill (num_decodes={nd})",
                    [(800, 1)] * 64 + [(400, 400)], num_decodes=nd)
        bench_mixed(rows, f"mixed 256 decode ctx 800 + 2x400 prefill (num_decodes={nd})",
                    [(800, 1)] * 256 + [(400, 400)] * 2, num_decodes=nd)
    for tokens in (512, 4096):
        bench_write(rows, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="where the JSON results go")
    parser.add_argument("--quick", action="store_true", help="a smaller sweep")
    parser.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8, 64, 256, 512],
                        help="decode batch sizes (comma-separated)")
    parser.add_argument("--contexts", type=lambda v: [int(x) for x in v.split(",")], default=[400, 800, 1400],
                        help="decode context lengths (comma-separated)")
    parser.add_argument("--decode-only", action="store_true", help="skip the prefill, mixed and KV-write cases")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # fail before the sweep, not after it
    started = time.time()
    copy_gbps = copy_bandwidth_gbps()
    rows: list[dict] = []
    for batch_size in args.batches:
        for ctx in args.contexts:
            bench_decode(rows, batch_size, ctx, copy_gbps, args.quick)
            print(f"decode batch {batch_size} ctx {ctx} done at {time.time() - started:.0f}s", flush=True)
    if not args.decode_only:
        bench_prefill_and_write(rows)

    best = {}
    for row in rows:
        if row.get("kind") == "decode" and row["case"] != "sdpa_contiguous" and row.get("ok"):
            key = f"b{row['batch']}_ctx{row['ctx']}"
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = row
    result = {
        "device": torch.cuda.get_device_name(), "sms": num_sms(torch.device("cuda")),
        "torch": torch.__version__, "triton": triton.__version__, "dtype": str(DTYPE),
        "heads": HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK,
        "copy_bandwidth_GBps": round(copy_gbps, 1), "all_ok": all(r.get("ok", True) for r in rows),
        "rows": rows, "best_decode": best, "seconds": round(time.time() - started, 1),
    }
    from chorus.atomic import atomic_write_text

    atomic_write_text(args.out, json.dumps(result, indent=1))

    print(f"\ncopy bandwidth {copy_gbps:.0f} GB/s; all outputs within bounds: {result['all_ok']}")
    print(f"{'batch':>5} {'ctx':>5} | {'default us':>10} {'GB/s':>6} {'splits':>6} | "
          f"{'best us':>8} {'best config':<40} | {'sdpa us':>8}")
    for row in rows:
        if row.get("kind") == "decode" and row["case"] == "default":
            key = f"b{row['batch']}_ctx{row['ctx']}"
            b = best.get(key, {})
            config = {k: v for k, v in b.items() if k.startswith(("decode_", "num_"))}
            sdpa = next((r["us"] for r in rows if r["case"] == "sdpa_contiguous"
                         and r["batch"] == row["batch"] and r["ctx"] == row["ctx"]), float("nan"))
            print(f"{row['batch']:>5} {row['ctx']:>5} | {row['us']:>10.1f} {row['GBps']:>6.0f} "
                  f"{row['splits']:>6} | {b.get('us', float('nan')):>8.1f} {str(config):<40} | "
                  f"{sdpa:>8.1f}")
    for row in rows:
        if row.get("kind") in ("mixed", "write_kv"):
            print(f"{row['case']}: {row['us']:.1f} us, {row['GBps']:.0f} GB/s"
                  + (f", {row['TFLOPs']} TFLOP/s" if "TFLOPs" in row else ""))


if __name__ == "__main__":
    main()
