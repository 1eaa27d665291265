"""How much the vocoder thread slows T3 down, and why: T3 decode steps timed alone and beside a
vocoder thread running passes graphed or eagerly; writes JSON to --out.

    python scripts/gpu/stage_contention.py --variant turbo --out contention.json

As in the pipeline: T3 (``chorus bench t3``'s engine, random weights, bf16, CUDA graphs, the
one-step lookahead) steps B requests on the main thread; the vocoder thread runs
``VocoderStage`` passes of ``--vocoder-items`` non-streaming jobs of ``--vocoder-tokens`` tokens
back to back on its own CUDA stream. Per mode (``alone``, ``graphed``: the vocoder's passes
replay CUDA graphs, ``eager``: they launch every kernel from Python) and batch size: T3's wall
time per step (p50, p90) over ``--steps`` steps, and the vocoder passes' wall time (p50) and
count meanwhile. ``vocoder_alone`` times the same passes with T3 idle. The difference between
``graphed`` and ``alone`` is what sharing the GPU (and the little host work left) costs T3; the
difference between ``eager`` and ``graphed`` is what the eager passes' thousands of launches,
each taking the GIL back, cost it.

``--green-sms 96,112`` adds modes ``green-N``: the vocoder thread's passes (graphed) run in a CUDA
green context of N of the device's SMs (``torch.cuda.green_contexts``), T3 on the whole device as
before, so T3's kernels always find SMs that no vocoder block holds. ``vocoder_alone`` then also
times the passes in each partition with T3 idle (what the partition costs the vocoder).
Graphs captured on the device's primary context and replayed on a partition's stream ran on the
whole device (a pass took as long in 66 SMs as in 132); ``--green-capture`` captures the
vocoder's graphs on the partition's stream instead, with its context current on the capturing
thread, to see whether the partition then binds.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chorus.bench.t3_bench import T3BenchConfig, bench_engine, fixed_length_params, load_bench_model, workload_chunks  # noqa: E402
from chorus.engine.engine import T3Request  # noqa: E402
from chorus.pipeline.conditioning import ConditioningCache  # noqa: E402
from chorus.vocoder import VocoderConfig, VocoderStage  # noqa: E402
from tests.vocoder.models import random_s3gen, random_tokens, random_voice  # noqa: E402


class GreenPartition:
    """A green context of ``sms`` SMs and a stream whose work runs on them (torch's API as the
    installed version offers it: ``GreenContext.Stream()``, or the context made current on this
    thread and its default stream)."""

    def __init__(self, sms: int):
        from torch.cuda.green_contexts import GreenContext

        self.context = GreenContext.create(num_sms=sms, device_id=torch.cuda.current_device())
        self.sms = sms
        if hasattr(self.context, "Stream"):
            self.api = "GreenContext.Stream"
            self.stream = self.context.Stream()
        else:
            self.api = "set_context + default stream"
            self.stream = None

    def enter(self, make_current: bool = False) -> torch.cuda.Stream:
        """On the thread that will launch the work: the stream to launch it on (``make_current``:
        the green context is also made current on this thread)."""
        if self.stream is not None:
            if make_current:
                self.context.set_context()
            return self.stream
        self.context.set_context()
        return torch.cuda.default_stream()


class VocoderLoad:
    """Back-to-back vocoder passes on a side stream in a thread, until stopped."""

    def __init__(self, stage: VocoderStage, items: int, tokens: int, partition: GreenPartition | None = None,
                 capture_in_partition: bool = False):
        self.stage, self.items, self.tokens = stage, items, tokens
        self.capture_in_partition = capture_in_partition and partition is not None
        self.voice = random_voice(250, seed=1)
        self.batch = [random_tokens(tokens, seed=i) for i in range(items)]
        self.partition = partition
        self.stream = torch.cuda.Stream()
        self.pass_seconds: list[float] = []
        self._stop = threading.Event()
        self._count = 0

    def one_pass(self) -> float:
        for i, tokens in enumerate(self.batch):
            job = f"p{self._count}-{i}"
            self.stage.add(job, self.voice, seed=i, streaming=False)
            self.stage.push(job, tokens, final=True)
        self._count += 1
        started = time.perf_counter()
        with torch.cuda.stream(self.stream):
            outs = self.stage.step()
        assert len(outs) == self.items and all(o.error is None for o in outs)
        return time.perf_counter() - started

    def run(self) -> None:
        if self.partition is not None:
            self.stream = self.partition.enter(self.capture_in_partition)
        while not self._stop.is_set():
            self.pass_seconds.append(self.one_pass())

    def alone(self, passes: int) -> list[float]:
        """``passes`` passes on a thread of their own (as under load), T3 idle."""
        times: list[float] = []

        def run() -> None:
            if self.partition is not None:
                self.stream = self.partition.enter(self.capture_in_partition)
                if self.capture_in_partition:  # graphs not yet captured are captured on the partition's stream
                    self.stage._graphs.flow_graphs._target.stream = self.stream
            times.extend(self.one_pass() for _ in range(passes))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return times

    def __enter__(self):
        self.pass_seconds.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def t3_engine(model, variant, cfg, conditioning, text_ids, batch: int, steps: int):
    """An engine with ``batch`` requests prefilled and decoding (built, and its CUDA graphs
    captured, before any vocoder load starts, as in the pipeline)."""
    rows = batch * (2 if variant.t3.supports_cfg and cfg.cfg_weight > 0 else 1)
    engine = bench_engine(model, variant, cfg, rows)
    total = 2 * steps + 32
    for i in range(batch):
        engine.add_request(T3Request(text_ids, conditioning, fixed_length_params(variant, cfg, total, i)))
    while engine.scheduler.waiting or engine.scheduler.num_prefilling:
        engine.step()
    for _ in range(16):
        engine.step()
    torch.cuda.synchronize()
    return engine


def t3_steps(engine, steps: int) -> list[float]:
    times, last = [], time.perf_counter()
    for _ in range(steps):
        engine.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def _release(engine) -> None:
    engine.runner.graphs = engine.runner.sampler_graphs = None
    del engine
    gc.collect()
    torch.cuda.empty_cache()


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="turbo")
    parser.add_argument("--batch-sizes", default="1,64")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocoder-items", type=int, default=8)
    parser.add_argument("--vocoder-tokens", type=int, default=100)
    parser.add_argument("--modes", default="alone,graphed,eager")
    parser.add_argument("--green-sms", default="", help="SM counts of green-context modes, e.g. 96,112")
    parser.add_argument("--green-capture", action="store_true",
                        help="capture the green modes' vocoder graphs on the partition's stream, its context current")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = T3BenchConfig(variant=args.variant)
    variant, model, encoder, voice, _ = load_bench_model(cfg)
    conditioning = ConditioningCache(model, variant).get(voice, variant.sampling.exaggeration)
    text_ids = encoder.encode(workload_chunks(cfg)[0])
    s3gen = random_s3gen(args.variant, tiny=False, seed=1, dtype=torch.bfloat16, device="cuda")
    report = {"variant": args.variant, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "green_capture": args.green_capture,
              "steps": args.steps, "vocoder_items": args.vocoder_items, "vocoder_tokens": args.vocoder_tokens,
              "vocoder_alone": {}, "t3": []}
    modes = [m for m in args.modes.split(",") if m] + [f"green-{n}" for n in args.green_sms.split(",") if n]
    report["sms"] = torch.cuda.get_device_properties().multi_processor_count
    loads = {}
    for mode in [m for m in modes if m != "alone"]:
        stage = VocoderStage(s3gen, VocoderConfig(cuda_graphs=mode != "eager", capture_after=1,
                                                  max_batch_items=args.vocoder_items))
        try:
            partition = GreenPartition(int(mode.removeprefix("green-"))) if mode.startswith("green-") else None
            load = VocoderLoad(stage, args.vocoder_items, args.vocoder_tokens, partition,
                               capture_in_partition=args.green_capture)
            if load.capture_in_partition:
                load.alone(2)  # captures and first-use costs first, in the partition
            else:
                [load.one_pass() for _ in range(2)]  # captures and first-use costs first, on the default context
            times = load.alone(4)
        except Exception as error:  # an experiment: record why a mode could not run and go on
            report["vocoder_alone"][mode] = {"error": f"{type(error).__name__}: {error}"[:1000]}
            print(mode, report["vocoder_alone"][mode], flush=True)
            continue
        report["vocoder_alone"][mode] = {"pass_ms_p50": _ms(times, 0.5),
                                         **({"api": partition.api} if partition else {})}
        print(mode, report["vocoder_alone"][mode], flush=True)
        loads[mode] = load
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        for mode in [m for m in modes if m == "alone" or m in loads]:
            engine = t3_engine(model, variant, cfg, conditioning, text_ids, batch, args.steps)
            if mode == "alone":
                steps, passes = t3_steps(engine, args.steps), []
            else:
                with loads[mode] as load:
                    steps = t3_steps(engine, args.steps)
                passes = list(load.pass_seconds)
            _release(engine)
            del engine  # the caller's reference too: the next engine's KV pool needs the memory back
            gc.collect()
            torch.cuda.empty_cache()
            row = {"batch": batch, "mode": mode, "t3_step_ms_p50": _ms(steps, 0.5), "t3_step_ms_p90": _ms(steps, 0.9),
                   "t3_mean_ms": round(1000 * statistics.mean(steps), 3), "vocoder_passes": len(passes),
                   "vocoder_pass_ms_p50": _ms(passes, 0.5)}
            report["t3"].append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
