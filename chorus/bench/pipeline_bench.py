"""``chorus bench offline`` and ``chorus bench stream``: the whole text-to-audio path.

Output lengths are fixed like ``chorus bench t3`` does (``tokens_per_char`` speech tokens per
input character; EOS banned until then), so random weights give a trained model's amount of work.

- offline: benchmark-text-1 (or ``--text-file``) chunked at sentences, every chunk submitted at
  once through the pipeline, one voice; T3 busy time, S3Gen busy time, wall time and their
  overlap. With ``reference``, the reference package's ``generate()`` (as shipped: one chunk at a
  time, fp32) on the same weights and device, warm (one untimed call first), on chunks evenly
  spaced over the workload (at least ``reference_chunks``, more until a minute of audio),
  reported per second of audio, so the speed-up is a ratio measured side by side;
  ``reference.method`` and ``speedup_method`` say so in the report.
- stream: N concurrent streaming requests of one sentence each, per concurrency level: time to
  first audio, the gaps between audio pieces, each stream's real-time factor and stalls (a stall
  is a piece that arrives after the audio before it has finished playing).
"""
from __future__ import annotations

import asyncio
import gc
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from chorus import gc_pauses
from chorus.bench.reference_timing import DEFAULT_REFERENCE_CHUNKS, MIN_TIMED_AUDIO_S
from chorus.models.speech_tokens import TOKENS_PER_SECOND
from chorus.bench.t3_bench import workload_chunks
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.models.loading import Checkpoint, parse_device, resolve_dtype
from chorus.models.random_checkpoint import write_random_checkpoint
from chorus.models.s3gen.s3gen import SAMPLE_RATE
from chorus.models.variants import get_variant
from chorus.pipeline.models import SpeechModels
from chorus.pipeline.pipeline import Pipeline, PipelineConfig
from chorus.pipeline.request import SpeechRequest
from chorus.vocoder import VocoderConfig, VocoderStats
from chorus.text import DEFAULT_MAX_CHARS

STREAM_TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs back into the forest "
               "to find its friends before the sun goes down.")


@dataclass
class PipelineBenchConfig:
    variant: str = "turbo"
    checkpoint: str | None = None  # None: random weights in a temporary directory
    dtype: str = "auto"
    device: str = "auto"
    text_file: str | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    tokens_per_char: float = 1.6
    cfg_weight: float = 0.5
    flow_steps: int | None = None  # None: the variant's (10, meanflow 2)
    reference: bool = False
    reference_chunks: int = DEFAULT_REFERENCE_CHUNKS  # the least timed; more until reference_min_audio_s
    reference_min_audio_s: float = MIN_TIMED_AUDIO_S
    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    stream_text: str = STREAM_TEXT
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 16384
    max_model_len: int = 2048
    kv_cache_gib: float = 40.0  # on CUDA; the CPU runs with 1 GiB
    cuda_graphs: bool = True
    fp8_linears: bool = False  # EngineConfig.fp8_linears
    vocoder: VocoderConfig | None = None  # None: VocoderConfig()
    extra: dict = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pipeline(models: SpeechModels, cfg: PipelineBenchConfig) -> Pipeline:
    cuda = models.device.type == "cuda"
    engine = EngineConfig(
        variant=models.variant.name, default_deadline_s=None, fp8_linears=cfg.fp8_linears,
        cache=CacheConfig(kv_cache_bytes=int((cfg.kv_cache_gib if cuda else 1.0) * 2**30)),
        scheduler=SchedulerConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                  max_model_len=cfg.max_model_len))
    pipe = Pipeline(models, PipelineConfig(engine=engine, vocoder=cfg.vocoder, max_chars=cfg.max_chars,
                                           cuda_graphs=cfg.cuda_graphs)).start()
    pipe.warmup()  # the vocoder's solver graphs, as `chorus serve` captures them before serving
    return pipe


def _request(models: SpeechModels, cfg: PipelineBenchConfig, text: str, seed: int, *, stream: bool) -> SpeechRequest:
    n = max(1, round(cfg.tokens_per_char * len(text)))
    return SpeechRequest(text, seed=seed, max_new_tokens=n, min_new_tokens=n, flow_steps=cfg.flow_steps,
                         cfg_weight=cfg.cfg_weight if models.variant.t3.supports_cfg else None,
                         normalize=False, stream=stream)


def _warm_up(pipe: Pipeline, models: SpeechModels, cfg: PipelineBenchConfig) -> None:
    """Requests of a few lengths, streamed and not, so that one-time work (kernel compilation
    for new shapes, allocator growth) is not timed."""
    texts = ["Warm up, one two three.", "A second warm-up sentence.", cfg.stream_text, cfg.stream_text[:60]]
    pipe.generate([_request(models, cfg, t, i, stream=i % 2 == 1) for i, t in enumerate(texts)])


class _Collector:
    """A timed run under the garbage collector `chorus serve` runs with (its ``gc_freeze``):
    what is alive when the run starts (models, graphs, the warm pipeline) is frozen, so the
    collector's full collections, which stop every thread, traverse only what the run creates;
    thawed when it ends. Reports the run's pauses (every thread's): their number, their sum
    and the longest per generation, and how many objects were frozen."""

    def __init__(self):
        self._watch = gc_pauses.PauseWatch()
        self._frozen = 0

    def __enter__(self) -> "_Collector":
        gc_pauses.freeze()
        self._frozen = gc.get_freeze_count()
        self._watch.start()
        return self

    def __exit__(self, *exc) -> None:
        self._watch.stop()
        gc_pauses.thaw()

    def report(self) -> dict:
        seen: list[tuple[int, float]] = []
        self._watch.drain(lambda generation, seconds: seen.append((generation, seconds)))
        return {"frozen_objects": self._frozen, "count": len(seen), "total_s": round(sum(s for _, s in seen), 4),
                "max_s_by_generation": {str(g): round(max(s for h, s in seen if h == g), 4)
                                        for g in sorted({g for g, _ in seen})}}


class _PassTimeline:
    """What each vocoder pass of a timed span did and when, next to T3's last step: the pipeline's
    timing listener, reading the stage's live counters on the vocoder thread right after each
    pass (so two successive reads bracket exactly one pass)."""

    COUNTERS = ("items", "padded_tokens", "eager_runs", "graph_captures", "graph_capture_seconds",
                "flow_seconds", "hift_seconds")

    def __init__(self, pipe: Pipeline):
        self._stats = pipe.vocoder.stats  # the live object
        self._last = self._read()
        self.t3_ends: list[float] = []
        self.t3_seconds: list[float] = []
        self.passes: list[dict] = []

    def _read(self) -> dict:
        return {name: getattr(self._stats, name) for name in self.COUNTERS}

    def __call__(self, stage: str, seconds: float) -> None:
        now = time.perf_counter()
        if stage == "t3":
            self.t3_ends.append(now)
            self.t3_seconds.append(seconds)
        elif stage == "vocoder":
            counters = self._read()
            delta = {name: counters[name] - self._last[name] for name in self.COUNTERS}
            self._last = counters
            self.passes.append({"end": now, "seconds": seconds, **delta})

    def report(self, start: float) -> dict:
        t3_end = max(self.t3_ends, default=start) - start
        rows = [{"end_s": round(p["end"] - start, 4), "seconds": round(p["seconds"], 4), "items": p["items"],
                 "padded_tokens": p["padded_tokens"], "eager_runs": p["eager_runs"],
                 "graph_captures": p["graph_captures"],
                 "flow_device_s": round(p["flow_seconds"], 4), "hift_device_s": round(p["hift_seconds"], 4)}
                for p in self.passes]

        def part(selected: list[dict]) -> dict:
            return {"passes": len(selected), "items": sum(r["items"] for r in selected),
                    "busy_s": round(sum(r["seconds"] for r in selected), 3),
                    "flow_device_s": round(sum(r["flow_device_s"] for r in selected), 3),
                    "hift_device_s": round(sum(r["hift_device_s"] for r in selected), 3)}

        return {"t3_last_step_end_s": round(t3_end, 4),
                "during_t3": part([r for r in rows if r["end_s"] <= t3_end]),
                "after_t3": part([r for r in rows if r["end_s"] > t3_end]),
                "passes": rows}


def bench_offline(models: SpeechModels, cfg: PipelineBenchConfig, chunks: list[str]) -> dict:
    pipe = _pipeline(models, cfg)
    try:
        _warm_up(pipe, models, cfg)
        before = pipe.stats()
        requests = [_request(models, cfg, c, i, stream=False) for i, c in enumerate(chunks)]
        timeline = _PassTimeline(pipe)
        pipe.set_timing_listener(timeline)
        _sync(models.device)
        with _Collector() as collector:
            start = time.perf_counter()
            results = pipe.generate(requests)
            _sync(models.device)
            wall = time.perf_counter() - start
        pipe.set_timing_listener(None)
        after = pipe.stats()
    finally:
        pipe.close()
    tokens = sum(ch.speech_tokens for r in results for ch in r.chunks)
    expected = sum(max(1, round(cfg.tokens_per_char * len(c))) for c in chunks)
    assert tokens == expected, f"fixed lengths were not honoured ({tokens} != {expected})"
    audio = sum(r.duration for r in results)
    t3_s = after.t3_busy_s - before.t3_busy_s
    s3gen_s = after.vocoder_busy_s - before.vocoder_busy_s
    return {"chunks": len(chunks), "speech_tokens": tokens, "audio_seconds": round(audio, 2),
            **_vocoder_work(before.vocoder, after.vocoder),
            "t3_seconds": round(t3_s, 3), "s3gen_seconds": round(s3gen_s, 3), "total_seconds": round(wall, 3),
            "overlap_seconds": round(max(0.0, t3_s + s3gen_s - wall), 3),
            "x_realtime": round(audio / wall, 1), "seconds_per_audio_second": round(wall / audio, 5),
            "gc": collector.report(), "timeline": timeline.report(start)}


def _vocoder_work(was: VocoderStats, done: VocoderStats) -> dict:
    """The vocoder stage's counters between two snapshots (the timed run's share)."""
    audio_tokens = (done.audio_seconds - was.audio_seconds) * TOKENS_PER_SECOND
    return {"vocoder_passes": done.passes - was.passes, "vocoder_items": done.items - was.items,
            "vocoder_graph_replays": done.graph_replays - was.graph_replays,
            "vocoder_graph_captures": done.graph_captures - was.graph_captures,
            "vocoder_graph_capture_seconds": round(done.graph_capture_seconds - was.graph_capture_seconds, 2),
            "vocoder_eager_runs": done.eager_runs - was.eager_runs,
            "vocoder_flow_device_seconds": round(done.flow_seconds - was.flow_seconds, 3),
            "vocoder_hift_device_seconds": round(done.hift_seconds - was.hift_seconds, 3),
            "vocoder_padding_overhead": round(
                (done.padded_tokens - was.padded_tokens) / max(1, done.real_tokens - was.real_tokens) - 1, 4),
            # the flow's input (each item's prompt + the tokens its pass read) per token of audio out
            "vocoder_flow_tokens_per_audio_token": round(
                (done.real_tokens - was.real_tokens) / audio_tokens, 3) if audio_tokens else None}


def bench_stream(pipe: Pipeline, models: SpeechModels, cfg: PipelineBenchConfig, concurrency: int) -> dict:
    """``concurrency`` streaming requests submitted at once; per stream the arrival time of
    every audio piece. The streams are consumed as the server consumes them: on one asyncio
    event loop (this thread), not a thread each, so the harness adds one thread to the GIL's
    contenders, not ``concurrency``."""
    before = pipe.stats()
    requests = [_request(models, cfg, cfg.stream_text, i, stream=True) for i in range(concurrency)]
    plans = [pipe.plan(r) for r in requests]
    arrivals: list[list[tuple[float, int]]] = [[] for _ in plans]
    starts = [0.0] * len(plans)
    first_tokens: list[float] = []
    errors: list[str] = []

    async def consume(i: int) -> None:
        try:
            starts[i] = time.perf_counter()
            stream = pipe.submit(plans[i])
            async for piece in stream:
                arrivals[i].append((time.perf_counter(), piece.samples.size))
            first_tokens.append((await stream.aresult()).timings.get("first_token_s", float("nan")))
        except Exception as exc:  # noqa: BLE001 - reported in the JSON
            errors.append(f"{type(exc).__name__}: {exc}")

    async def consume_all() -> None:
        await asyncio.gather(*(consume(i) for i in range(len(plans))))

    timeline = _PassTimeline(pipe)
    pipe.set_timing_listener(timeline)
    with _Collector() as collector:
        begin = time.perf_counter()
        try:
            asyncio.run(consume_all())
        finally:
            pipe.set_timing_listener(None)
    wall = time.perf_counter() - begin
    stats = pipe.stats()
    ttfa, first_audio, gaps, rtf, stalls = [], [], [], [], []
    audio_s = sum(n for pieces in arrivals for _, n in pieces) / SAMPLE_RATE
    for start, pieces in zip(starts, arrivals):
        audible = [(t, n) for t, n in pieces if n]
        if not audible:
            continue
        ttfa.append(audible[0][0] - start)
        first_audio.append(audible[0][0])
        times = [t for t, _ in audible]
        gaps.extend(np.diff(times).tolist())
        audio = sum(n for _, n in audible) / SAMPLE_RATE
        rtf.append(audio / max(times[-1] - start, 1e-9))
        played, stall = 0.0, 0.0  # playback starts at the first piece
        for (t, n) in audible:
            due = times[0] + played + stall
            stall += max(0.0, t - due)
            played += n / SAMPLE_RATE
        stalls.append(stall)

    def pct(values, q):
        return round(float(np.percentile(values, q)), 4) if values else None

    return {"concurrency": concurrency, "errors": errors[:5], "num_errors": len(errors), "wall_seconds": round(wall, 3),
            "ttfa_s": {"p50": pct(ttfa, 50), "p90": pct(ttfa, 90), "p99": pct(ttfa, 99), "max": pct(ttfa, 100)},
            "first_token_s": {"p50": pct(first_tokens, 50), "p99": pct(first_tokens, 99)},
            "gap_s": {"p50": pct(gaps, 50), "p99": pct(gaps, 99), "max": pct(gaps, 100)},
            "rtf": {"min": pct(rtf, 0), "p50": pct(rtf, 50)},
            "streams_faster_than_realtime": sum(1 for s in stalls if s == 0.0),
            "stall_s": {"p50": pct(stalls, 50), "max": pct(stalls, 100)},
            "t3_busy_s": round(stats.t3_busy_s - before.t3_busy_s, 3),
            "s3gen_busy_s": round(stats.vocoder_busy_s - before.vocoder_busy_s, 3),
            "audio_seconds": round(audio_s, 2),
            "s3gen_busy_per_audio_s": round((stats.vocoder_busy_s - before.vocoder_busy_s) / audio_s, 5)
            if audio_s else None,
            **_vocoder_work(before.vocoder, stats.vocoder), "gc": collector.report(),
            # when each pass and each T3 step ended and when each stream's first audio arrived,
            # from the level's start
            "timeline": {**timeline.report(begin),
                         "t3_step_ends_s": [round(t - begin, 4) for t in timeline.t3_ends],
                         "t3_step_seconds": [round(t, 4) for t in timeline.t3_seconds],
                         "first_audio_s": sorted(round(t - begin, 4) for t in first_audio)}}


def _load(cfg: PipelineBenchConfig, tmp: str) -> tuple[SpeechModels, Path, bool]:
    variant = get_variant(cfg.variant)
    device = parse_device(cfg.device)
    random_weights = cfg.checkpoint is None
    location = cfg.checkpoint or write_random_checkpoint(variant, tmp)
    ckpt = Checkpoint.open(variant, location)
    random_weights = random_weights or ckpt.has_random_weights
    models = SpeechModels.load(variant, ckpt, dtype=resolve_dtype(cfg.dtype, device), device=device,
                               voice_models=False)
    return models, ckpt.directory, random_weights


def _header(models: SpeechModels, cfg: PipelineBenchConfig, random_weights: bool) -> dict:
    device = models.device
    flow_steps = cfg.flow_steps or models.variant.s3gen.flow_steps
    return {"variant": models.variant.name, "dtype": str(models.t3.dtype).removeprefix("torch."),
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "random_weights": random_weights, "tokens_per_char": cfg.tokens_per_char,
            "cfg_weight": cfg.cfg_weight if models.variant.t3.supports_cfg else 0.0,
            "flow_steps": flow_steps, "vocoder": asdict(cfg.vocoder or VocoderConfig()),
            "fp8_linears": cfg.fp8_linears, "torch": torch.__version__}


def run_offline(cfg: PipelineBenchConfig) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        models, directory, random_weights = _load(cfg, tmp)
        chunks = workload_chunks(cfg)
        report = _header(models, cfg, random_weights)
        report["offline"] = bench_offline(models, cfg, chunks)
        if cfg.reference:
            report["reference"] = _reference(models, cfg, directory, chunks)
            ref = report["reference"]
            if "seconds_per_audio_second" in ref:
                report["speedup_vs_reference"] = round(
                    ref["seconds_per_audio_second"] / report["offline"]["seconds_per_audio_second"], 1)
                report["speedup_method"] = REFERENCE_SPEEDUP_METHOD
    return report


REFERENCE_SPEEDUP_METHOD = ("reference.seconds_per_audio_second (warm: one untimed generate() first, then "
                            "evenly spaced chunks, see reference.method) / offline.seconds_per_audio_second (the "
                            "whole workload through the warm pipeline)")


def _reference(models: SpeechModels, cfg: PipelineBenchConfig, directory: Path, chunks: list[str], load=None) -> dict:
    from chorus.bench.reference_pipeline import run_reference_pipeline

    if models.device.type == "cuda":  # hand cached blocks back: the reference loads its own models
        torch.cuda.empty_cache()
    try:
        return run_reference_pipeline(models.variant, directory, chunks,
                                      [max(1, round(cfg.tokens_per_char * len(c))) for c in chunks],
                                      cfg_weight=cfg.cfg_weight, device=models.device,
                                      min_chunks=cfg.reference_chunks, min_audio_s=cfg.reference_min_audio_s,
                                      load=load)
    except Exception as exc:  # noqa: BLE001 - our figures stay valid without the ratio
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_stream(cfg: PipelineBenchConfig) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        models, _, random_weights = _load(cfg, tmp)
        report = _header(models, cfg, random_weights)
        report["stream_text_chars"] = len(cfg.stream_text)
        pipe = _pipeline(models, cfg)
        try:
            _warm_up(pipe, models, cfg)
            report["stream"] = [bench_stream(pipe, models, cfg, n) for n in cfg.concurrency]
        finally:
            pipe.close()
    return report
