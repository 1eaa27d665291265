"""Where a steady T3 decode step's GPU time goes, kernel by kernel; writes JSON to --out.

    python scripts/gpu/profile_step.py --variant turbo --batch 256 --grow 200 --out profile.json

Random weights, bf16, CUDA graphs and the one-step lookahead as in ``chorus bench t3``: B
requests with the workload's voice and its first chunk's text are prefilled, decode ``--grow``
steps (the context a workload reaches mid-way), then ``--steps`` steps run under
``torch.profiler``. Reported per kernel (name cut to 120 characters): calls and device
microseconds per step, and its share of the device time; plus the wall time per step outside
the profiler. A kernel replayed inside a CUDA graph is listed under its own name.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chorus.bench.t3_bench import T3BenchConfig, bench_engine, fixed_length_params, load_bench_model, workload_chunks  # noqa: E402
from chorus.engine.engine import T3Request  # noqa: E402
from chorus.pipeline.conditioning import ConditioningCache  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="turbo")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--grow", type=int, default=200, help="decode steps before profiling")
    parser.add_argument("--steps", type=int, default=20, help="profiled decode steps")
    parser.add_argument("--no-shared-prefix", action="store_true")
    parser.add_argument("--device", default="auto", help="cuda (default when present); cpu only checks the script")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = T3BenchConfig(variant=args.variant, device=args.device, shared_prefix_attention=not args.no_shared_prefix)
    variant, model, encoder, voice, _ = load_bench_model(cfg)
    conditioning = ConditioningCache(model, variant).get(voice, variant.sampling.exaggeration)
    text_ids = encoder.encode(workload_chunks(cfg)[0])
    rows_per_request = 2 if variant.t3.supports_cfg and cfg.cfg_weight > 0 else 1
    engine = bench_engine(model, variant, cfg, args.batch * rows_per_request)
    total = args.grow + 3 * args.steps + 16
    for i in range(args.batch):
        engine.add_request(T3Request(text_ids, conditioning, fixed_length_params(variant, cfg, total, i)))
    while engine.scheduler.waiting or engine.scheduler.num_prefilling:
        engine.step()
    for _ in range(args.grow):
        engine.step()
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    sync()
    wall_ms = 1000 * (time.perf_counter() - start) / args.steps
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            engine.step()
        sync()
    kernels = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0)
        if device_us <= 0:
            continue
        kernels.append({"name": event.key[:120], "calls_per_step": round(event.count / args.steps, 2),
                        "us_per_step": round(device_us / args.steps, 2)})
    kernels.sort(key=lambda k: -k["us_per_step"])
    device_us = sum(k["us_per_step"] for k in kernels)
    for k in kernels:
        k["share"] = round(k["us_per_step"] / device_us, 4)
    context = sum(r.num_tokens for r in engine.scheduler.running) / max(1, len(engine.scheduler.running))
    report = {"variant": variant.name, "batch": args.batch, "rows": args.batch * rows_per_request,
              "mean_context_tokens": round(context, 1), "text_tokens": len(text_ids),
              "shared_prefix_attention": cfg.shared_prefix_attention, "wall_ms_per_step": round(wall_ms, 3),
              "device_ms_per_step": round(device_us / 1000, 3), "kernels": kernels}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{variant.name} batch {args.batch}: wall {wall_ms:.3f} ms/step, device {device_us / 1000:.3f} ms/step, "
          f"context {context:.0f}")
    for k in kernels[:25]:
        print(f"{k['us_per_step']:9.1f} us {k['calls_per_step']:6.1f}x {100 * k['share']:5.1f}%  {k['name']}")


if __name__ == "__main__":
    main()
