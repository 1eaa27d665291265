"""Host (Python) cost of a steady decode step of the T3 engine, phase by phase; print JSON.

    python scripts/measure_host_step.py [--requests 1,64,256] [--steps 64] [--variant original] [--host-only]

Runs a tiny random-weight model on the CPU (its forward is fast, and the measured phases are
pure host work whatever the device): all requests prefilled, then every step is a decode step
of every request (CFG on where the variant has it: two rows per request). Reports per step, in
ms: ``schedule`` (Scheduler.schedule), ``prepare`` (ModelRunner.prepare), ``update``
(Scheduler.update_from_output) and ``step`` (a whole T3Engine.step, forward and sampling
included); mean and median over the steps (the mean includes garbage-collection pauses and
other processes' noise). Prepare is timed on its own and then runs again inside ``execute``, as in
``chorus bench t3``. ``--steps`` should span a few block boundaries (block_size 16).
``--host-only`` skips the forward and sampling (every request "samples" one fixed token) and
turns the garbage collector off while timing: the host phases alone, with less noise.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig  # noqa: E402
from chorus.engine.engine import T3Engine, T3Request  # noqa: E402
from chorus.sampling import SamplingParams  # noqa: E402
from tests.engine.tiny_models import conditioning, tiny, voice  # noqa: E402


def measure(variant_name: str, num_requests: int, steps: int, warmup: int = 4, host_only: bool = False) -> dict:
    variant, model = tiny(variant_name)
    rows = 2 if variant.t3.supports_cfg else 1
    config = EngineConfig(
        variant=variant.name, default_deadline_s=None, cache=CacheConfig(kv_cache_bytes=256 << 20),
        scheduler=SchedulerConfig(max_num_seqs=max(rows * num_requests, 8), max_num_batched_tokens=16384,
                                  max_model_len=1024))
    engine = T3Engine(model, variant, config)
    total = warmup + 2 * steps + 8
    cond = conditioning(variant, model, voice(variant, 0))
    for i in range(num_requests):
        params = SamplingParams.for_variant(variant, seed=i, max_new_tokens=total, min_new_tokens=total,
                                            cfg_weight=0.5 if variant.t3.supports_cfg else None)
        engine.add_request(T3Request(list(range(10, 30 + i % 7)), cond, params))
    while any(r.num_computed_tokens < r.prompt.num_tokens for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(warmup):
        engine.step()

    engine.finish_in_flight()  # the phases below drive the scheduler and the runner directly
    phases = {k: [] for k in ("schedule", "prepare", "update", "step")}
    scheduler, runner = engine.scheduler, engine.runner
    if host_only:
        gc.collect()
        gc.disable()
    for _ in range(steps):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        runner.prepare(out)
        t2 = time.perf_counter()
        sampled = dict.fromkeys(out.requests, 100) if host_only else runner.execute(out)
        t3 = time.perf_counter()
        scheduler.update_from_output(out, sampled)
        t4 = time.perf_counter()
        assert len(out.requests) == num_requests and out.total_num_tokens == rows * num_requests
        phases["schedule"].append(t1 - t0)
        phases["prepare"].append(t2 - t1)
        phases["update"].append(t4 - t3)
    gc.enable()
    for _ in range(0 if host_only else steps):
        t0 = time.perf_counter()
        engine.step()
        phases["step"].append(time.perf_counter() - t0)
    if host_only:
        del phases["step"]
    result = {"requests": num_requests, "rows": rows * num_requests}
    for stat, f in (("mean", statistics.fmean), ("median", statistics.median)):
        ms = {k: round(1000 * f(v), 3) for k, v in phases.items()}
        ms["host"] = round(ms["schedule"] + ms["prepare"] + ms["update"], 3)
        result[stat] = ms
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="1,64,256")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--variant", default="original")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--host-only", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for n in (int(x) for x in args.requests.split(",")):
        print(json.dumps(measure(args.variant, n, args.steps, host_only=args.host_only)), flush=True)


if __name__ == "__main__":
    main()
