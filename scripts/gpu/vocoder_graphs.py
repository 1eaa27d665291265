"""Time one vocoder pass run eagerly vs as CUDA graphs (flow and HiFT); writes JSON to --out.

    python scripts/gpu/vocoder_graphs.py --out results/vocoder_graphs.json
    python scripts/gpu/vocoder_graphs.py --out /tmp/smoke.json --device cpu --tiny   # smoke test

A pass is ``VocoderStage.step`` over B streaming jobs that each have exactly one window ready
(W new tokens plus the held-back right context, on a voice prompt of 150 tokens): flow encoder,
flow-matching solver, HiFT, the host copies; as a stream's first pass runs. Full-size S3Gen with
random weights (the work does not depend on the weights), bf16 on CUDA. Per variant (original:
10 flow steps with CFG; turbo: 2 meanflow steps), batch size and window: the median pass time
eager and with graphs (after the graph is captured), the first graphed pass (which captures),
the capture time, the graphed audio's SNR against the eager audio (same noise), and a
breakdown (flow: encoder and solver / HiFT) of the stage's own device-time counters.
``--warmup-budget`` > 0 also times ``VocoderStage.warmup`` for the variant's default shapes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chorus.vocoder import VocoderConfig, VocoderStage  # noqa: E402
from chorus.vocoder.quality import snr_db  # noqa: E402
from chorus.vocoder.pass_graphs import frame_bucket, row_bucket  # noqa: E402
from tests.vocoder.models import random_s3gen, random_tokens, random_voice  # noqa: E402

VOICES = 4  # distinct voices (same prompt length) shared round-robin by the jobs of a pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PassBench:
    """Runs single passes of B fresh streaming jobs through one stage."""

    def __init__(self, s3gen, args, batch: int, window: int, graphs: bool):
        self.s3gen, self.batch, self.window = s3gen, batch, window
        self.n_steps, self.cfg_rate = args.solver[s3gen.variant.name]
        config = VocoderConfig(first_window_tokens=window, max_window_tokens=max(window, 100),
                               max_batch_items=batch, max_batch_tokens=1 << 30, cuda_graphs=graphs,
                               max_graph_rows=max(batch, 1), max_pass_seconds=None)  # one pass of all B
        self.stage = VocoderStage(s3gen, config)
        self.voices = [random_voice(args.prompt_tokens, seed=100 + v) for v in range(VOICES)]
        ready = window + config.holdback_tokens + 1  # one token past the window's pass makes it ready
        self.tokens = [random_tokens(ready, seed=i) for i in range(batch)]
        self.runs = 0

    def run(self) -> tuple[float, list[torch.Tensor]]:
        """One pass: (seconds, each job's audio)."""
        stage, ids = self.stage, [f"r{self.runs}-{i}" for i in range(self.batch)]
        self.runs += 1
        for i, job in enumerate(ids):
            stage.add(job, self.voices[i % VOICES], seed=i, streaming=True, n_steps=self.n_steps,
                      cfg_rate=self.cfg_rate)
            stage.push(job, self.tokens[i])
        items, device = stage.stats.items, self.s3gen.device
        _sync(device)
        started = time.perf_counter()
        outs = stage.step()
        _sync(device)
        seconds = time.perf_counter() - started
        assert stage.stats.items - items == self.batch, "every job must run in the one pass"
        assert all(o.error is None for o in outs), [o.error for o in outs]
        audio = {o.job_id: o.samples for o in outs}
        for job in ids:
            stage.abort(job)
        return seconds, [audio.get(job, torch.zeros(0)) for job in ids]


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 3)


def measure(s3gen, args, batch: int, window: int) -> dict:
    device = s3gen.device
    ratio = s3gen.flow.config.token_mel_ratio
    frames = ratio * (args.prompt_tokens + window + VocoderConfig().holdback_tokens)
    row = {"variant": s3gen.variant.name, "n_steps": args.solver[s3gen.variant.name][0],
           "cfg_rate": args.solver[s3gen.variant.name][1], "batch": batch, "window_tokens": window,
           "frames": frames, "bucket": {"rows": row_bucket(batch), "frames": frame_bucket(frames)}}
    eager = PassBench(s3gen, args, batch, window, graphs=False)
    graphed = PassBench(s3gen, args, batch, window, graphs=True)
    for _ in range(args.warmup_passes):  # cuDNN/cuBLAS choices, allocator, voice cache
        _, eager_audio = eager.run()
    for _ in range(VocoderConfig().capture_after - 1):
        graphed.run()  # eager until a shape's capture_after-th use
    first_seconds, graphed_audio = graphed.run()  # captures the flow and HiFT graphs
    stats = graphed.stage.stats
    row["graphs_active"] = graphed.stage.graphs.active
    row["first_graphed_pass_ms"] = _ms(first_seconds)
    row["graph_captures"] = stats.graph_captures
    row["capture_ms"] = _ms(stats.graph_capture_seconds)
    snrs = [snr_db(e, g) for e, g in zip(eager_audio, graphed_audio) if e.numel() and e.abs().max() > 0]
    worst = min(snrs) if snrs else None
    row["snr_db_min"] = None if worst is None else round(worst, 1) if worst != float("inf") else "inf (equal)"
    for _ in range(args.warmup_passes - 1):
        graphed.run()
    times = {"eager": [], "graphed": []}
    for _ in range(args.repeats):  # interleaved, so drifting clocks hit both alike
        times["eager"].append(eager.run()[0])
        times["graphed"].append(graphed.run()[0])
    for mode, values in times.items():
        row[f"{mode}_ms_median"] = _ms(statistics.median(values))
        row[f"{mode}_ms_min"] = _ms(min(values))
    row["speedup"] = round(row["eager_ms_median"] / row["graphed_ms_median"], 2)
    row["graph_replays"] = stats.graph_replays
    if args.breakdown_passes:
        row["breakdown_ms"] = {}
        for mode, graphs in (("eager", False), ("graphed", True)):
            bench = PassBench(s3gen, args, batch, window, graphs=graphs)
            for _ in range(VocoderConfig().capture_after):
                bench.run()  # capture (graphed) or warm (eager) outside the averages
            before = asdict(bench.stage.stats)
            for _ in range(args.breakdown_passes):
                bench.run()
            after = asdict(bench.stage.stats)
            per = {k: (after[k] - before[k]) / args.breakdown_passes for k in
                   ("flow_seconds", "hift_seconds", "total_seconds")}
            row["breakdown_ms"][mode] = {"flow": _ms(per["flow_seconds"]), "hift": _ms(per["hift_seconds"]),
                                         "pass": _ms(per["total_seconds"])}
    if device.type == "cuda":
        row["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
    return row


def time_warmup(s3gen, args) -> dict:
    stage = VocoderStage(s3gen)
    started = time.perf_counter()
    captured = stage.warmup(prompt_tokens=args.prompt_tokens, time_budget_s=args.warmup_budget)
    seconds = time.perf_counter() - started
    flow, hift = stage.graphs.flow_graphs.keys, stage.graphs.hift_graphs.keys
    return {"graphs": captured, "seconds": round(seconds, 2), "budget_s": args.warmup_budget,
            "flow": {"rows": sorted({k.rows for k in flow}), "frames": sorted({k.frames for k in flow})},
            "hift": {"rows": sorted({k.rows for k in hift}), "frames": sorted({k.frames for k in hift})}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--tiny", action="store_true", help="tiny random models (a smoke test)")
    parser.add_argument("--variants", default="original,turbo")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--windows", default="20,100", help="new tokens per pass")
    parser.add_argument("--prompt-tokens", type=int, default=150)
    parser.add_argument("--original-cfg-rate", type=float, default=None,
                        help="CFG weight of the original's solve (default: the variant's)")
    parser.add_argument("--repeats", type=int, default=10, help="timed passes per mode")
    parser.add_argument("--warmup-passes", type=int, default=2)
    parser.add_argument("--breakdown-passes", type=int, default=3, help="passes timed per stage part (0: none)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="let cuDNN autotune its convolution algorithms (torch.backends.cudnn.benchmark)")
    parser.add_argument("--warmup-budget", type=float, default=120.0,
                        help="seconds for VocoderStage.warmup per variant (0: do not time it)")
    args = parser.parse_args()
    if args.repeats < 1 or args.warmup_passes < 1:
        parser.error("--repeats and --warmup-passes must be >= 1")
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": str(dtype), "size": "tiny" if args.tiny else "full",
              "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "cudnn_benchmark": args.cudnn_benchmark,
              "results": [], "warmup": {}}
    print(json.dumps({k: v for k, v in report.items() if k not in ("results", "warmup")}), flush=True)
    for name in args.variants.split(","):
        s3gen = random_s3gen(name, tiny=args.tiny, seed=1, dtype=dtype, device=str(device))
        settings = s3gen.variant.s3gen
        cfg_rate = settings.cfg_rate if args.original_cfg_rate is None or settings.meanflow else args.original_cfg_rate
        args.solver = {name: (settings.flow_steps, cfg_rate)}
        for window in (int(w) for w in args.windows.split(",")):
            for batch in (int(b) for b in args.batch_sizes.split(",")):
                row = measure(s3gen, args, batch, window)
                print(json.dumps(row), flush=True)
                report["results"].append(row)
        if args.warmup_budget > 0:
            report["warmup"][name] = time_warmup(s3gen, args)
            print(json.dumps({"warmup": name, **report["warmup"][name]}), flush=True)
        del s3gen
        if device.type == "cuda":
            torch.cuda.empty_cache()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
