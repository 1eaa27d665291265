"""How long a burst of streams waits for T3's first step, on tiny random models on the CPU; print JSON.

    python scripts/measure_admission.py [--streams 256] [--repeats 3] [--out admission.json]

``--streams`` streaming requests are submitted at once from one asyncio event loop (as the
server submits them) to a warm pipeline of tiny turbo models; per repeat, the seconds from the
first submit to the start of T3's first step, which is when the burst has been admitted (each
request's checks and prompt embeddings, on T3's thread, beside the vocoder thread adding the
same streams and the event loop submitting them, all on one GIL; docs/engine.md,
"Admission"). On a GPU, ``chorus bench stream``'s timeline gives the same interval
(``t3_step_ends_s[0] - t3_step_seconds[0]``).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.bench.report import write_report  # noqa: E402
from chorus.bench.pipeline_bench import PipelineBenchConfig, _pipeline, _request, _warm_up  # noqa: E402
from chorus.engine.engine import T3Engine  # noqa: E402
from tests.voices.checkpoints import BASE_ENV  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault(BASE_ENV, tempfile.mkdtemp(prefix="chorus-admission-"))
    from tests.pipeline.tiny_pipeline import tiny_models

    models = tiny_models("turbo")
    cfg = PipelineBenchConfig(variant="turbo", tokens_per_char=0.4, max_num_seqs=max(512, args.streams),
                              max_num_batched_tokens=16384, max_model_len=1024)
    pipe = _pipeline(models, cfg)
    step_starts: list[float] = []
    original = T3Engine.step

    def step(engine):
        step_starts.append(time.perf_counter())
        return original(engine)

    T3Engine.step = step
    waits = []
    try:
        _warm_up(pipe, models, cfg)
        for _ in range(args.repeats):
            plans = [pipe.plan(_request(models, cfg, cfg.stream_text, i, stream=True)) for i in range(args.streams)]

            async def burst() -> None:
                async def one(plan) -> None:
                    async for _ in pipe.submit(plan):
                        pass

                await asyncio.gather(*(one(p) for p in plans))

            step_starts.clear()
            began = time.perf_counter()
            asyncio.run(burst())
            waits.append(round(step_starts[0] - began, 4))
    finally:
        T3Engine.step = original
        pipe.close()
    report = {"streams": args.streams, "first_step_starts_s": waits, "device": "cpu", "models": "tiny turbo"}
    write_report(report, args.out)


if __name__ == "__main__":
    main()
