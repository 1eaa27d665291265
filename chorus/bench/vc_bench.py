"""``chorus bench vc``: one voice conversion at a time, end to end, as ``chorus vc`` runs it.

Per run, a source clip of ``source_s`` seconds at 16 kHz (a synthetic voiced signal, already
decoded: the time of decoding a file is not the model's) is converted to the checkpoint's
built-in voice on a vocoder stage of its own, non-streamed (one S3Gen pass, the reference's
``S3Gen.inference``). Timed with the device synchronised around each part:

- ``plan_seconds``: the source checked and tokenized by the checkpoint's S3 tokenizer
  (``ConversionPlanner.plan``; the target's conditioning is the built-in voice's, already made);
- ``vocode_seconds``: the S3Gen pass over every source token (``convert_on_stage``);
- ``total_seconds``: both.

``warmup`` untimed runs first (the stage's graphs captured, kernels chosen), then ``repeats``
timed ones, each with its own seed; the report gives the median, min and max of each part, the
tokens, the audio seconds and the real-time factor. Weights are random unless ``checkpoint`` is
given (a random-weight checkpoint is written for the run): the time does not depend on them.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from chorus.bench.report import write_report
from chorus.models.loading import dtype_name

SOURCE_RATE = 16000


@dataclass(frozen=True)
class VCBenchConfig:
    variant: str = "turbo"
    checkpoint: str | None = None  # None: random weights written for the run
    dtype: str = "auto"
    device: str = "auto"
    source_s: float = 10.0  # the source clip's length
    repeats: int = 10  # timed conversions
    warmup: int = 2  # untimed conversions first
    flow_steps: int | None = None  # None: the variant's
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.1 <= self.source_s <= 60:
            raise ValueError(f"source_s must be in [0.1, 60] seconds, got {self.source_s!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        if self.flow_steps is not None and self.flow_steps < 1:
            raise ValueError(f"flow_steps must be >= 1, got {self.flow_steps}")


def synthetic_source(seconds: float, seed: int = 0) -> np.ndarray:
    """``seconds`` of a voiced-like signal at 16 kHz: a gliding 110-220 Hz tone with harmonics,
    syllables at 4 per second, a little noise (deterministic for ``seed``)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * SOURCE_RATE))) / SOURCE_RATE
    pitch = 150 + 40 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SOURCE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    syllables = np.clip(np.sin(2 * np.pi * 4 * t), 0, None)
    wav = 0.3 * voiced * syllables + 0.01 * rng.standard_normal(t.size)
    return (wav / np.max(np.abs(wav)) * 0.5).astype(np.float32)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(seconds: list[float]) -> dict:
    return {"median": round(statistics.median(seconds), 6), "min": round(min(seconds), 6),
            "max": round(max(seconds), 6), "all": [round(s, 6) for s in seconds]}


def run(cfg: VCBenchConfig, s3gen=None, voice=None) -> dict:
    """The report; ``s3gen`` (with its voice models) and ``voice`` replace the loaded model and
    its built-in voice (tests pass tiny ones)."""
    from chorus.bench.vocoder_bench import load_bench_s3gen
    from chorus.conversion.config import ConversionConfig
    from chorus.conversion.planner import ConversionPlanner
    from chorus.conversion.request import ConversionRequest
    from chorus.conversion.runner import convert_on_stage
    from chorus.vocoder import VocoderStage

    random_weights = None
    if s3gen is None or voice is None:
        s3gen, voice, random_weights = load_bench_s3gen(cfg, voice_models=True)
    device = s3gen.device
    planner = ConversionPlanner.for_s3gen(s3gen, builtin_voice=lambda: voice,
                                          config=ConversionConfig(max_source_s=max(60.0, cfg.source_s)))
    stage = VocoderStage(s3gen)
    source = synthetic_source(cfg.source_s, cfg.seed)
    parts: dict[str, list[float]] = {"plan": [], "vocode": [], "total": []}
    tokens = audio_s = 0
    for i in range(cfg.warmup + cfg.repeats):
        request = ConversionRequest(source, sample_rate=SOURCE_RATE, seed=cfg.seed + i, flow_steps=cfg.flow_steps,
                                    request_id=f"bench-vc-{i}")
        _sync(device)
        start = time.perf_counter()
        plan = planner.plan(request)
        _sync(device)
        planned = time.perf_counter()
        result = convert_on_stage(stage, plan)
        _sync(device)
        done = time.perf_counter()
        if i >= cfg.warmup:
            parts["plan"].append(planned - start)
            parts["vocode"].append(done - planned)
            parts["total"].append(done - start)
        tokens, audio_s = len(plan.tokens), result.duration
    total = statistics.median(parts["total"])
    settings = s3gen.variant.s3gen
    return {
        "variant": s3gen.variant.name, "dtype": dtype_name(s3gen.dtype), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "random_weights": random_weights, "torch": torch.__version__,
        "config": dataclasses.asdict(cfg),
        "n_steps": settings.flow_steps if cfg.flow_steps is None else cfg.flow_steps,
        "source_seconds": round(source.size / SOURCE_RATE, 4), "source_tokens": tokens,
        "prompt_tokens": voice.s3gen_prompt_tokens.shape[1], "audio_seconds": round(audio_s, 4),
        "plan_seconds": _summary(parts["plan"]), "vocode_seconds": _summary(parts["vocode"]),
        "total_seconds": _summary(parts["total"]), "realtime_factor": round(audio_s / total, 2),
        "method": (f"{cfg.warmup} untimed conversions, then {cfg.repeats} timed, one at a time, each with its own "
                   "seed; a synthetic source already decoded at 16 kHz; the built-in voice as the target; "
                   "non-streamed (one S3Gen pass); the device synchronised around each part; medians"),
    }


def format_table(report: dict) -> str:
    plan, vocode, total = (report[k]["median"] for k in ("plan_seconds", "vocode_seconds", "total_seconds"))
    return (f"{report['variant']} {report['dtype']} on {report['device_name']}: a {report['source_seconds']:g} s "
            f"source ({report['source_tokens']} tokens), {report['n_steps']} flow steps\n"
            f"plan {1000 * plan:.1f} ms + vocode {1000 * vocode:.1f} ms = {1000 * total:.1f} ms "
            f"(median; {report['realtime_factor']:g}x real time)")


def main_json(cfg: VCBenchConfig, out: str | None) -> dict:
    """Run, print the summary to stderr and the JSON report to stdout (and to ``out``, atomically)."""
    report = run(cfg)
    write_report(report, out, format_table(report))
    return report
