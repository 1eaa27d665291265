"""Plain, exact text-to-speech of one request: text -> chunks -> T3 -> S3Gen -> one waveform.

This is the reference path of Chorus (``chorus synth`` runs it); the serving engine is compared
against it. Per chunk of text (:func:`chorus.text.split_into_chunks`): T3 generates speech tokens
one at a time (:func:`chorus.t3_sequential.generate_speech_tokens`), S3Gen turns them into 24 kHz
audio with the variant's token clean-up and trim/fade, and the chunks are joined end to end. An
optional watermark runs last, on the whole waveform.

Seeding: chunk ``i`` uses seed ``seed + i`` for both its T3 sampling and its S3Gen noise, so the
same text, voice, parameters and seed give the same audio.

Typical use::

    synth = Synthesizer.load("turbo", "/path/to/checkpoint")
    result = synth.synthesize("Hello there.", voice="me.wav", seed=7)
    write_audio("out.wav", result.wav, result.sample_rate)
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chorus.models.loading import Checkpoint, CheckpointNotFoundError, load_t3, parse_device, parse_dtype
from chorus.models.s3gen.s3gen import SAMPLE_RATE, S3Gen
from chorus.models.variants import Variant, get_variant
from chorus.sampling import SamplingParams
from chorus.sampling.params import MAX_SEED
from chorus.t3_sequential import FinishReason, generate_speech_tokens
from chorus.text import DEFAULT_MAX_CHARS, TextEncoder, TextInputError, load_text_encoder, split_into_chunks
from chorus.voices import Voice, VoiceFrontEnd
from chorus.voices.builder import VoiceSource

logger = logging.getLogger(__name__)

VOICE_FILE_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class ChunkResult:
    """What happened to one chunk of the text."""

    text: str
    seed: int
    speech_tokens: int  # tokens T3 generated (before S3Gen's clean-up)
    finish_reason: FinishReason
    num_samples: int


@dataclass(frozen=True)
class SynthesisResult:
    wav: np.ndarray  # (samples,) float32 in [-1, 1]
    sample_rate: int
    seed: int
    chunks: tuple[ChunkResult, ...]
    ignored: tuple[str, ...] = ()  # parameters the variant does not use (reset, as the reference does)

    @property
    def duration(self) -> float:
        return len(self.wav) / self.sample_rate


def t3_text_ids(encoder: TextEncoder, text: str, language: str | None) -> list[int]:
    """Tokenizer output for T3, without SOT/EOT: T3 frames the text itself."""
    return encoder.encode(text, language=language)


def plan_text(encoder: TextEncoder, text: str, language: str | None = None, *,
              max_chars: int = DEFAULT_MAX_CHARS) -> list[tuple[str, list[int]]]:
    """Split ``text`` into chunks and tokenize each: ``[(chunk, T3 text ids)]``. Raises a
    :class:`chorus.text.TextError` for empty text or a missing/unsupported language, before any
    model runs."""
    if not isinstance(text, str) or not text.strip():
        raise TextInputError("text is empty; give at least one word to speak")
    encoder.check_language(language)
    return [(chunk, t3_text_ids(encoder, chunk, language)) for chunk in split_into_chunks(text, max_chars=max_chars)]


def _check_number(name: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


class Synthesizer:
    """Loaded models of one checkpoint (T3, S3Gen, text encoder, optionally the voice front end),
    reused across calls of :meth:`synthesize`. Not thread-safe."""

    def __init__(self, checkpoint: Checkpoint, t3, s3gen: S3Gen, text_encoder: TextEncoder,
                 front_end: VoiceFrontEnd | None = None):
        self.checkpoint = checkpoint
        self.t3 = t3
        self.s3gen = s3gen
        self.text_encoder = text_encoder
        self.front_end = front_end
        self._builtin: Voice | None = None

    @classmethod
    def load(cls, variant: Variant | str, checkpoint: Checkpoint | str | os.PathLike | None = None, *,
             dtype: str | torch.dtype = "fp32", device: str | torch.device | None = "cpu",
             voice_models: bool = True) -> "Synthesizer":
        """Load every model of ``checkpoint`` (a :class:`Checkpoint`, a directory, a hub id, or
        None for the variant's official repo). ``voice_models=False`` skips the models that build
        voices from reference clips (then only built-in and saved voices work)."""
        variant = get_variant(variant) if isinstance(variant, str) else variant
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = Checkpoint.open(variant, checkpoint)
        elif checkpoint.variant.name != variant.name:
            raise ValueError(f"the checkpoint is for {checkpoint.variant.name}, not {variant.name}")
        dtype, device = parse_dtype(dtype), parse_device(device)
        text_encoder = load_text_encoder(variant, checkpoint.directory)
        t3 = load_t3(checkpoint, dtype=dtype, device=device)
        s3gen = S3Gen.from_checkpoint(checkpoint, dtype=dtype, device=device, voice_models=voice_models)
        front_end = VoiceFrontEnd.from_checkpoint(checkpoint, device=device, s3gen=s3gen) if voice_models else None
        return cls(checkpoint, t3, s3gen, text_encoder, front_end)

    @property
    def variant(self) -> Variant:
        return self.checkpoint.variant

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    # ------------------------------------------------------------------------------------ voices
    def builtin_voice(self) -> Voice:
        """The checkpoint's ``conds.pt`` voice."""
        if self._builtin is None:
            if not self.checkpoint.has_builtin_voice():
                raise CheckpointNotFoundError(
                    f"the checkpoint at {self.checkpoint.directory} has no built-in voice "
                    f"({self.variant.files.conds}); pass a reference clip or a voice file")
            self._builtin = Voice.from_conditionals(self.checkpoint.builtin_voice_state())
        return self._builtin

    def resolve_voice(self, voice: Voice | VoiceSource | None, *, sample_rate: int | None = None) -> Voice:
        """None -> the built-in voice; a :class:`Voice` as is; a ``.safetensors`` path -> a saved
        voice; any other path, bytes, file object or array (with ``sample_rate``) -> a reference
        clip to build a voice from."""
        if voice is None:
            return self.builtin_voice()
        if isinstance(voice, Voice):
            return self._checked(voice)
        if isinstance(voice, (str, os.PathLike)) and Path(voice).suffix.lower() == VOICE_FILE_SUFFIX:
            return self._checked(Voice.load(voice))
        if self.front_end is None:
            raise ValueError("this Synthesizer was loaded without the voice models "
                             "(voice_models=False); it cannot build a voice from audio")
        return self.front_end.build(voice, sample_rate=sample_rate)

    def _checked(self, voice: Voice) -> Voice:
        voice.check_variant(self.variant)
        expected = self.variant.t3.speech_cond_prompt_len
        if voice.t3_prompt_tokens.shape[1] > expected:
            logger.warning("voice %r has %d T3 prompt tokens; %s voices have at most %d (was it built for "
                           "another variant?)", voice.name, voice.t3_prompt_tokens.shape[1], self.variant.name,
                           expected)
        return voice

    # -------------------------------------------------------------------------------- synthesis
    def plan(self, text: str, language: str | None = None, *, max_chars: int = DEFAULT_MAX_CHARS
             ) -> list[tuple[str, list[int]]]:
        """See :func:`plan_text`."""
        return plan_text(self.text_encoder, text, language, max_chars=max_chars)

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """The variant's sampling defaults with ``overrides`` (None = default), validated."""
        return SamplingParams.for_variant(self.variant, **overrides)

    @torch.inference_mode()
    def synthesize(
        self, text: str, *, voice: Voice | VoiceSource | None = None, exaggeration: float | None = None,
        cfg_weight: float | None = None, temperature: float | None = None, top_p: float | None = None,
        min_p: float | None = None, top_k: int | None = None, repetition_penalty: float | None = None,
        seed: int | None = None, language: str | None = None, flow_steps: int | None = None,
        max_new_tokens: int | None = None, min_new_tokens: int | None = None, watermark: str | None = None,
        progress: bool = False, max_chars: int = DEFAULT_MAX_CHARS,
    ) -> SynthesisResult:
        """Speak ``text``; None for a parameter means the variant's default.

        ``max_new_tokens`` / ``min_new_tokens`` bound each chunk's speech tokens (25 per second);
        equal values fix a chunk's length. ``flow_steps`` sets S3Gen's solver steps (default 10,
        Turbo/Nano 2). ``watermark="perth"`` applies Resemble's Perth watermark (needs the
        ``watermark`` extra). Parameters a variant does not use (CFG, min-p and exaggeration on
        Turbo/Nano; top-k on the original and multilingual variants) are ignored with a warning,
        as the reference does, and listed in the result's ``ignored``.
        """
        variant = self.variant
        chunks = self.plan(text, language, max_chars=max_chars)
        params = self.sampling_params(
            temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k,
            repetition_penalty=repetition_penalty, cfg_weight=cfg_weight, seed=seed,
            max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)
        ignored = list(params.ignored)
        if flow_steps is not None and (isinstance(flow_steps, bool) or not isinstance(flow_steps, int) or flow_steps < 1):
            raise ValueError(f"flow_steps must be an integer >= 1, got {flow_steps!r}")
        if variant.t3.emotion_adv:
            exaggeration = variant.sampling.exaggeration if exaggeration is None else \
                _check_number("exaggeration", exaggeration, 0.0)
        else:
            if exaggeration:
                logger.warning("variant %s does not support exaggeration; ignoring it", variant.name)
                ignored.append("exaggeration")
            exaggeration = 0.0
        if watermark is not None:
            from chorus.watermark import get_watermarker

            marker = get_watermarker(watermark)  # fail before the models run
        else:
            marker = None
        resolved = self.resolve_voice(voice)
        cond = self.t3.encode_conditioning(resolved.speaker_embedding, resolved.t3_prompt_tokens, exaggeration,
                                           prompt_embeds=resolved.t3_prompt_embeds)
        base_seed = int(params.seed)
        pieces, results = [], []
        bar = _progress_bar(len(chunks), progress)
        try:
            for index, (chunk, text_ids) in enumerate(chunks):
                chunk_seed = (base_seed + index) % (MAX_SEED + 1)
                counter = _TokenCounter(bar)
                out = generate_speech_tokens(self.t3, variant, cond, torch.tensor(text_ids, dtype=torch.long),
                                             replace(params, seed=chunk_seed), on_token=counter)
                wav = self.s3gen.tokens_to_wav([out.tokens], resolved, seeds=[chunk_seed], n_steps=flow_steps)[0]
                pieces.append(wav.numpy())
                results.append(ChunkResult(chunk, chunk_seed, len(out.tokens), out.finish_reason, wav.shape[0]))
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        audio = np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, np.float32)
        if marker is not None:
            audio = marker.apply(audio, SAMPLE_RATE)
        return SynthesisResult(wav=audio, sample_rate=SAMPLE_RATE, seed=base_seed, chunks=tuple(results),
                               ignored=tuple(sorted(set(ignored))))


class _TokenCounter:
    """on_token callback that shows the running token count on the progress bar."""

    def __init__(self, bar):
        self.bar, self.count = bar, 0

    def __call__(self, token: int) -> None:
        self.count += 1
        if self.bar is not None and self.count % 10 == 0:
            self.bar.set_postfix(tokens=self.count, refresh=True)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="chunk", desc="synthesizing", leave=False)


def synthesize(
    text: str, *, variant: Variant | str, checkpoint: Checkpoint | str | os.PathLike | None = None,
    voice: Voice | VoiceSource | None = None, exaggeration: float | None = None, cfg_weight: float | None = None,
    temperature: float | None = None, top_p: float | None = None, min_p: float | None = None,
    top_k: int | None = None, repetition_penalty: float | None = None, seed: int | None = None,
    language: str | None = None, flow_steps: int | None = None, max_new_tokens: int | None = None,
    min_new_tokens: int | None = None, watermark: str | None = None, progress: bool = False,
    dtype: str | torch.dtype = "fp32", device: str | torch.device | None = "cpu",
) -> tuple[np.ndarray, int]:
    """One-shot text-to-speech: load the models, speak ``text``, return ``(wav float32, 24000)``.

    Loads everything on every call; keep a :class:`Synthesizer` to speak more than once.
    Parameters as in :meth:`Synthesizer.synthesize`.
    """
    needs_front_end = voice is not None and not isinstance(voice, Voice) and not (
        isinstance(voice, (str, os.PathLike)) and Path(voice).suffix.lower() == VOICE_FILE_SUFFIX)
    synth = Synthesizer.load(variant, checkpoint, dtype=dtype, device=device, voice_models=needs_front_end)
    result = synth.synthesize(
        text, voice=voice, exaggeration=exaggeration, cfg_weight=cfg_weight, temperature=temperature, top_p=top_p,
        min_p=min_p, top_k=top_k, repetition_penalty=repetition_penalty, seed=seed, language=language,
        flow_steps=flow_steps, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, watermark=watermark,
        progress=progress)
    return result.wav, result.sample_rate
