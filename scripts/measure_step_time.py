"""The longest T3 step during a burst of long texts, through the whole pipeline (T3 and vocoder
threads), on the CPU or a GPU.

    PYTHONPATH=. python scripts/measure_step_time.py --checkpoint ckpt/turbo --texts 3
    PYTHONPATH=. python scripts/measure_step_time.py --checkpoint ckpt/turbo --texts 3 --token-budget-only --shared-threads

``--token-budget-only`` turns the step-time target off (steps bounded by
``max_num_batched_tokens`` alone, as before the target existed); ``--shared-threads`` lets both
stage threads use all of torch's intra-op threads. With ``PYTHONPATH`` at a checkout from before
these options existed it runs that checkout as it is (give both flags). Prints one JSON object: every T3 step's wall
seconds and positions, the worst step, and the wall time of the burst (docs/engine.md, "Step
time").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

from importlib import resources

import torch


def main() -> None:
    from chorus.engine.config import EngineConfig, SchedulerConfig
    from chorus.pipeline.pipeline import Pipeline, PipelineConfig
    from chorus.pipeline.request import SpeechRequest

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--variant", default="turbo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--texts", type=int, default=3, help="long texts sent at once")
    parser.add_argument("--chars", type=int, default=900, help="characters per text")
    parser.add_argument("--max-new-tokens", type=int, default=20, help="speech tokens per chunk")
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096)
    parser.add_argument("--token-budget-only", action="store_true", help="no step-time target")
    parser.add_argument("--step-time-target", type=float, default=None, help="seconds (default: the device's)")
    parser.add_argument("--shared-threads", action="store_true", help="do not split intra-op threads")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    options = dict(variant=args.variant, max_num_batched_tokens=args.max_num_batched_tokens,
                   default_deadline_s=None, kv_cache_bytes=2 << 30)
    target = math.inf if args.token_budget_only else args.step_time_target
    if target is not None and "step_time_target_s" in SchedulerConfig.__dataclass_fields__:
        options["step_time_target_s"] = target
    # (an older checkout without these options runs as it is: --token-budget-only --shared-threads)
    config = PipelineConfig(engine=EngineConfig.from_flat(**options))
    if args.shared_threads and hasattr(config, "split_cpu_threads"):
        config = dataclasses.replace(config, split_cpu_threads=False)
    pipe = Pipeline.load(args.variant, args.checkpoint, device=args.device, voice_models=False, config=config)
    cost = getattr(pipe.engine.scheduler, "step_cost", None)
    seconds: list[float] = []
    real_step = pipe.engine.step

    def timed_step():
        start = time.perf_counter()
        out = real_step()
        seconds.append(time.perf_counter() - start)
        return out

    launched: list[int] = []
    real_launch = pipe.engine._launch

    def launch(out, pending):
        launched.append(out.total_num_tokens)
        return real_launch(out, pending)

    pipe.engine._launch = launch
    pipe.engine.step = timed_step
    text = " ".join(resources.files("chorus.assets").joinpath("benchmark-text-1.txt").read_text("utf-8").split())
    texts = [(text[i * 97:] + " " + text)[:args.chars] for i in range(args.texts)]
    try:
        started = time.perf_counter()
        streams = [pipe.submit(SpeechRequest(t, seed=i, max_new_tokens=args.max_new_tokens))
                   for i, t in enumerate(texts)]
        for s in streams:
            s.result()
        wall = time.perf_counter() - started
    finally:
        pipe.close()
    print(json.dumps({
        "device": args.device, "threads": torch.get_num_threads(), "texts": args.texts, "chars": args.chars,
        "step_time_target_s": getattr(pipe.engine.scheduler, "step_time_target_s", None),
        "split_threads": getattr(config, "split_cpu_threads", False), "steps": len(seconds),
        "worst_step_s": round(max(seconds), 3), "median_step_s": round(sorted(seconds)[len(seconds) // 2], 3),
        "burst_wall_s": round(wall, 2), "largest_step_positions": max(launched),
        "step_cost": {k: getattr(cost, k, None) for k in ("overhead_s", "decode_row_s", "prefill_token_s")},
        "step_seconds": [round(s, 3) for s in seconds], "step_positions": launched,
    }))


if __name__ == "__main__":
    main()
