"""The exact sequential path: one request, one chunk at a time, T3 then S3Gen.

This is the reference executor of Chorus (``chorus synth --exact`` runs it; tests compare the
pipeline against it). The request is validated and planned by the same
:class:`chorus.pipeline.planner.RequestPlanner` as the pipeline; then per chunk T3 generates
speech tokens one at a time (:func:`chorus.t3_sequential.generate_speech_tokens`), S3Gen turns
them into 24 kHz audio at batch 1, and the chunks are joined end to end. An optional watermark
runs last, on the whole waveform.

Seeding: chunk ``i`` uses seed ``seed + i`` for both its T3 sampling and its S3Gen noise, so the
same text, voice, parameters and seed give the same audio, here and in the pipeline.

Typical use::

    synth = Synthesizer.load("turbo", "/path/to/checkpoint")
    result = synth.synthesize("Hello there.", voice="me.wav", seed=7)
    write_audio("out.wav", result.wav, result.sample_rate)
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from chorus.models.loading import Checkpoint
from chorus.models.s3gen.s3gen import SAMPLE_RATE
from chorus.models.variants import Variant
from chorus.pipeline.models import SpeechModels
from chorus.pipeline.planner import SpeechPlan, needs_voice_models
from chorus.pipeline.request import ChunkResult, SpeechRequest, SpeechResult
from chorus.pipeline.stitch import pause_spans, stitch_chunks
from chorus.t3_sequential import generate_speech_tokens
from chorus.text import DEFAULT_MAX_CHARS
from chorus.voices import Voice


class Synthesizer:
    """The exact path over loaded models (:class:`SpeechModels`). Not thread-safe."""

    def __init__(self, models: SpeechModels, *, max_chars: int = DEFAULT_MAX_CHARS):
        self.models = models
        self.planner = models.planner(max_chars)

    @classmethod
    def load(cls, variant: Variant | str, checkpoint: Checkpoint | str | os.PathLike | None = None, *,
             dtype: str | torch.dtype = "auto", device: str | torch.device | None = "cpu",
             voice_models: bool = True) -> "Synthesizer":
        """See :meth:`SpeechModels.load`."""
        return cls(SpeechModels.load(variant, checkpoint, dtype=dtype, device=device, voice_models=voice_models))

    variant = property(lambda self: self.models.variant)
    t3 = property(lambda self: self.models.t3)
    s3gen = property(lambda self: self.models.s3gen)
    front_end = property(lambda self: self.models.front_end)
    sample_rate = property(lambda self: SAMPLE_RATE)

    def builtin_voice(self) -> Voice:
        return self.models.builtin_voice()

    def resolve_voice(self, voice: Any) -> Voice:
        """See :meth:`RequestPlanner.resolve_voice`."""
        return self.planner.resolve_voice(voice)

    @torch.inference_mode()
    def synthesize(self, text: str, *, progress: bool = False, **options: Any) -> SpeechResult:
        """Speak ``text``. ``options`` are the fields of :class:`SpeechRequest` (voice, language,
        exaggeration, cfg_weight, temperature, top_p, min_p, top_k, repetition_penalty, seed,
        max_new_tokens, min_new_tokens, flow_steps, watermark, normalize); None means the variant's
        default. Parameters a variant does not use are ignored with a warning, as the reference
        does, and listed in the result's ``ignored``."""
        return self.run(self.planner.plan(SpeechRequest(text, **options)), progress=progress)

    @torch.inference_mode()
    def run(self, plan: SpeechPlan, *, progress: bool = False) -> SpeechResult:
        """Execute a plan one chunk at a time."""
        models, variant = self.models, self.models.variant
        start = time.perf_counter()
        voice = plan.voice
        cond = models.t3.encode_conditioning(voice.speaker_embedding, voice.t3_prompt_tokens, plan.exaggeration,
                                             prompt_embeds=voice.t3_prompt_embeds)
        pieces, results = [], []
        bar = _progress_bar(len(plan.chunks), progress)
        try:
            for chunk in plan.chunks:
                out = generate_speech_tokens(models.t3, variant, cond, torch.tensor(chunk.text_ids, dtype=torch.long),
                                             chunk.params)
                wav = models.s3gen.tokens_to_wav([out.tokens], voice, seeds=[chunk.seed], n_steps=plan.flow_steps)[0]
                pieces.append(wav.numpy())
                results.append(ChunkResult(chunk.text, chunk.seed, len(out.tokens), out.finish_reason, wav.shape[0],
                                           tuple(out.tokens)))
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        audio = stitch_chunks(pieces, plan.pauses_s)
        if plan.watermark is not None:
            from chorus.watermark import get_watermarker

            audio = get_watermarker(plan.watermark).apply(audio, SAMPLE_RATE)
        return SpeechResult(wav=audio, sample_rate=SAMPLE_RATE, seed=plan.seed, chunks=tuple(results),
                            ignored=plan.ignored, request_id=plan.request_id,
                            timings={"total_s": time.perf_counter() - start},
                            pauses=pause_spans([p.size for p in pieces], plan.pauses_s))


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="chunk", desc="synthesizing", leave=False)


def synthesize(text: str, *, variant: Variant | str, checkpoint: Checkpoint | str | os.PathLike | None = None,
               dtype: str | torch.dtype = "auto", device: str | torch.device | None = "cpu",
               progress: bool = False, **options: Any) -> tuple[np.ndarray, int]:
    """One-shot text-to-speech on the exact path: load the models, speak ``text``, return
    ``(wav float32, 24000)``. Loads everything on every call; keep a :class:`Synthesizer` (or a
    :class:`chorus.pipeline.Pipeline`) to speak more than once. ``options`` as in
    :meth:`Synthesizer.synthesize`."""
    synth = Synthesizer.load(variant, checkpoint, dtype=dtype, device=device,
                             voice_models=needs_voice_models(options.get("voice")))
    result = synth.synthesize(text, progress=progress, **options)
    return result.wav, result.sample_rate
