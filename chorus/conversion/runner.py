"""How a :class:`ConversionPlan` becomes a vocoder-stage job, and a conversion run on a stage of
its own (``chorus vc``, which loads S3Gen only). The pipeline hands plans to its shared stage
with :func:`add_to_stage`, so conversions batch with text-to-speech jobs."""
from __future__ import annotations

import time

import numpy as np
import torch

from chorus.conversion.planner import ConversionPlan
from chorus.models.s3gen.s3gen import SAMPLE_RATE, TokenRules
from chorus.pipeline.request import ChunkResult, SpeechResult

FINISH_REASON = "source"  # a conversion's one "chunk" ends where its source ends


def add_to_stage(stage, plan: ConversionPlan, job_id: str) -> None:
    """Register the plan on a :class:`chorus.vocoder.VocoderStage` with all its tokens: a
    non-streamed conversion is one pass over every token (the reference's ``S3Gen.inference``),
    a streamed one comes out window by window as a stream of text-to-speech audio does."""
    stage.add(job_id, plan.target, seed=plan.seed, streaming=plan.stream, n_steps=plan.flow_steps,
              priority=int(plan.priority), rules=TokenRules.verbatim())
    stage.push(job_id, list(plan.tokens), final=True)


def conversion_result(plan: ConversionPlan, audio: np.ndarray, timings: dict[str, float] | None = None) -> SpeechResult:
    """The :class:`SpeechResult` of a finished conversion (one chunk: the whole source)."""
    chunk = ChunkResult("", plan.seed, len(plan.tokens), FINISH_REASON, int(audio.size))
    return SpeechResult(audio, SAMPLE_RATE, plan.seed, (chunk,), plan.ignored, plan.request_id, timings or {})


def watermarked(plan: ConversionPlan, audio: np.ndarray) -> np.ndarray:
    if plan.watermark is None:
        return audio
    from chorus.watermark import get_watermarker

    return get_watermarker(plan.watermark).apply(audio, SAMPLE_RATE)


def convert_on_stage(stage, plan: ConversionPlan, on_piece=None) -> SpeechResult:
    """Run one plan to the end on ``stage`` (which holds no other job), on this thread.
    ``on_piece(samples)`` is called with each piece as it comes (streamed plans give several).
    Raises ``RuntimeError`` when the stage fails the job."""
    job_id, start, pieces = plan.request_id, time.monotonic(), []
    add_to_stage(stage, plan, job_id)
    timings: dict[str, float] = {}
    while stage.has_job(job_id):
        for out in stage.step():
            if out.job_id != job_id:
                continue
            if out.error is not None:
                raise RuntimeError(f"voice conversion {job_id} failed: {out.error}")
            samples = out.samples.numpy() if isinstance(out.samples, torch.Tensor) else np.asarray(out.samples)
            if samples.size and "first_audio_s" not in timings:
                timings["first_audio_s"] = time.monotonic() - start
            pieces.append(samples)
            if on_piece is not None and samples.size:
                on_piece(samples)
    audio = np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, np.float32)
    timings["total_s"] = time.monotonic() - start
    return conversion_result(plan, watermarked(plan, audio), timings)
