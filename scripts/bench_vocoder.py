"""Time the vocoder stage's batching policies on the CPU: padded FIFO batches vs length buckets.

The same set of non-streaming jobs (lengths spread over a range, all final at once) is vocoded
with ``batching="fifo"`` and ``batching="length"``; for each, wall time, passes, and padded vs
real flow tokens are written as JSON.

    python scripts/bench_vocoder.py --out bench_vocoder.json [--variant turbo] [--fullsize]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.vocoder import VocoderConfig, VocoderStage  # noqa: E402
from tests.vocoder.models import random_s3gen, random_tokens, random_voice  # noqa: E402


def run(s3gen, config: VocoderConfig, jobs, n_steps) -> dict:
    stage = VocoderStage(s3gen, config)
    for job_id, tokens, voice in jobs:
        stage.add(job_id, voice, seed=1, streaming=False, n_steps=n_steps)
        stage.push(job_id, tokens, final=True)
    started = time.perf_counter()
    while stage.has_work():
        stage.step()
    seconds = time.perf_counter() - started
    stats = stage.stats
    return {"batching": config.batching, "seconds": round(seconds, 3), "passes": stats.passes,
            "padded_tokens": stats.padded_tokens, "real_tokens": stats.real_tokens,
            "padding_overhead": round(stats.padded_tokens / stats.real_tokens - 1, 3),
            "audio_seconds": round(stats.audio_seconds, 2),
            "real_time_factor": round(stats.audio_seconds / seconds, 1),
            "flow_s": round(stats.flow_seconds, 3), "hift_s": round(stats.hift_seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", default="turbo")
    parser.add_argument("--fullsize", action="store_true")
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--max-batch-items", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="flow steps (default: the variant's)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    s3gen = random_s3gen(args.variant, tiny=not args.fullsize, seed=1)
    voice = random_voice(50, seed=2)
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(10, 250, (args.jobs,), generator=g).tolist()
    jobs = [(f"j{i}", random_tokens(n, seed=i), voice) for i, n in enumerate(lengths)]
    results = []
    for policy in ("fifo", "length") * args.repeats:
        config = VocoderConfig(max_batch_items=args.max_batch_items, batching=policy)
        row = run(s3gen, config, jobs, args.steps)
        print(json.dumps(row), flush=True)
        results.append(row)
    Path(args.out).write_text(json.dumps({
        "variant": args.variant, "size": "full" if args.fullsize else "tiny", "threads": torch.get_num_threads(),
        "job_token_lengths": lengths, "config": asdict(VocoderConfig(max_batch_items=args.max_batch_items)),
        "results": results}, indent=2))


if __name__ == "__main__":
    main()
