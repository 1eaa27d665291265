"""Validate a :class:`ConversionRequest` and plan it: settings, the source clip, the target
voice's S3Gen conditioning and the source's speech tokens, all before S3Gen runs.

The source is tokenized here, on the caller's thread, by the checkpoint's S3 tokenizer (the port
the voice builder uses; clips over 30 s are tokenized in windows as the reference does), and the
tokens go to S3Gen unchanged (``TokenRules.verbatim``), as ``ChatterboxVC.generate`` hands them
to ``S3Gen.inference``.

Targets. S3Gen's conditioning (prompt tokens, prompt mel, x-vector) comes from a clip through the
S3 tokenizer and CAMPPlus of the checkpoint's S3Gen file, and Turbo/Nano voices are built from a
loudness-normalised clip: a voice belongs to the S3Gen *kind* of the variant it was built for,
standard (original, multilingual v2/v3: ``s3gen.safetensors`` / ``s3gen.pt``) or meanflow (Turbo,
Nano: ``s3gen_meanflow.safetensors``). Voice conversion takes a voice built for any variant of the
loaded model's kind (a Turbo voice converts on a Nano model, a multilingual voice on the original)
and refuses one of the other kind (:func:`check_s3gen_kind`): build the voice again for a variant
of the loaded kind. A target clip is made into S3Gen conditioning the way the reference's
``set_target_voice`` does (its first 10 s at 24 kHz, no loudness normalisation), with the loaded
model's own tokenizer and CAMPPlus, so it suits the model whatever its kind.
"""
from __future__ import annotations

import itertools
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chorus.conversion.config import ConversionConfig
from chorus.conversion.request import ConversionRequest
from chorus.conversion.source import SourceAudio, prepare_source
from chorus.engine.request import Priority
from chorus.models.variants import Variant
from chorus.voices.voice import VOICE_FILE_SUFFIX, S3GenPrompt, Voice, VoiceFormatError

_ids = itertools.count()
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class ConversionPlan:
    """A validated conversion: the source's speech tokens, the target and the settings."""

    request_id: str
    tokens: tuple[int, ...]  # S3 tokens of the source, vocoded as they are
    target: S3GenPrompt
    seed: int
    flow_steps: int | None  # None: the variant's default
    priority: Priority
    deadline_s: float | None
    start_deadline_s: float | None
    stream: bool
    watermark: str | None
    source_seconds: float
    ignored: tuple[str, ...] = ()


def s3gen_kind(variant: Variant) -> str:
    return "meanflow" if variant.s3gen.meanflow else "standard"


def check_s3gen_kind(voice: Voice, variant: Variant) -> Voice:
    """Return ``voice`` if its S3Gen conditioning suits ``variant``'s S3Gen (the same kind, see
    the module docstring), else raise :class:`VoiceFormatError` saying what to do. Voices of
    unknown origin (the built-in voice, old files) pass."""
    from chorus.models.variants import VARIANTS, get_variant

    if voice.variant is None:
        return voice
    if voice.variant not in VARIANTS:
        raise VoiceFormatError(f"voice {voice.name or '(unnamed)'!r} was built for an unknown variant "
                               f"{voice.variant!r}")
    built_for = get_variant(voice.variant)
    if s3gen_kind(built_for) != s3gen_kind(variant):
        same = [name for name, v in VARIANTS.items() if s3gen_kind(v) == s3gen_kind(variant)]
        raise VoiceFormatError(
            f"voice {voice.name or '(unnamed)'!r} was built for {built_for.name}, whose S3Gen is the "
            f"{s3gen_kind(built_for)} one; this {variant.name} model's S3Gen is the {s3gen_kind(variant)} one: "
            f"build the voice for {' or '.join(same)} (`chorus voice create --variant {variant.name}`), "
            f"or give the target as a reference clip")
    return voice


class ConversionPlanner:
    """Plans conversions for one loaded S3Gen.

    tokenizer: the checkpoint's S3 tokenizer (``S3TokenizerV2``); campplus: its CAMPPlus (only
    needed for targets given as clips); builtin_voice: returns the checkpoint's built-in voice
    (raises when it has none).
    """

    def __init__(self, variant: Variant, tokenizer, *, campplus=None, builtin_voice: Callable[[], Voice],
                 config: ConversionConfig = ConversionConfig()):
        self.variant = variant
        self.tokenizer = tokenizer
        self.campplus = campplus
        self._builtin_voice = builtin_voice
        self.config = config

    @classmethod
    def for_s3gen(cls, s3gen, *, builtin_voice: Callable[[], Voice],
                  config: ConversionConfig = ConversionConfig()) -> "ConversionPlanner":
        """From a loaded :class:`chorus.models.s3gen.s3gen.S3Gen` built with its voice models."""
        if s3gen.tokenizer is None:
            raise ValueError("voice conversion needs the S3 tokenizer: load S3Gen with its voice models "
                             "(voice_models=True)")
        return cls(s3gen.variant, s3gen.tokenizer, campplus=s3gen.speaker_encoder, builtin_voice=builtin_voice,
                   config=config)

    # ---------------------------------------------------------------------------------- parts
    def prepare_source(self, request: ConversionRequest) -> SourceAudio:
        """Decode and check the source (no model runs)."""
        if isinstance(request.source, SourceAudio):
            return request.source
        return prepare_source(request.source, self.config, sample_rate=request.sample_rate)

    def resolve_target(self, voice: Any) -> S3GenPrompt:
        """The target's S3Gen conditioning; see :class:`ConversionRequest` for what ``voice`` may be."""
        if voice is None:
            return check_s3gen_kind(self._builtin_voice(), self.variant).s3gen_prompt
        if isinstance(voice, S3GenPrompt):
            return voice
        if isinstance(voice, Voice):
            return check_s3gen_kind(voice, self.variant).s3gen_prompt
        if isinstance(voice, (str, os.PathLike)) and Path(voice).suffix.lower() == VOICE_FILE_SUFFIX:
            return check_s3gen_kind(Voice.load(voice), self.variant).s3gen_prompt
        return self.target_from_clip(voice)

    def target_from_clip(self, clip: Any, *, name: str | None = None) -> S3GenPrompt:
        """S3Gen conditioning of a reference clip, as ``ChatterboxVC.set_target_voice`` makes it:
        the clip at 24 kHz (soxr HQ), its first 10 s through ``embed_ref``. The clip rules of
        docs/voices.md apply (decodable, at least 0.5 s, not silent), without a variant's minimum
        length or loudness normalisation (the reference's VC has neither)."""
        from chorus.audio import ReferenceAudio, ReferencePolicy, prepare_reference
        from chorus.voices.builder import s3gen_prompt

        if self.campplus is None:
            raise ValueError("the voice models are not loaded, so a target clip cannot be embedded here; "
                             "give a voice (a saved voice file or a voice id) or load with voice models")
        reference = clip if isinstance(clip, ReferenceAudio) else \
            prepare_reference(clip, ReferencePolicy(variant_name="voice conversion"))
        if name is None:
            name = Path(os.fspath(clip)).stem if isinstance(clip, (str, os.PathLike)) else ""
        return s3gen_prompt(reference.s3gen_prompt_24k, self.tokenizer, self.campplus, name=name)

    def tokenize(self, source: SourceAudio) -> tuple[int, ...]:
        """The source's S3 speech tokens (25 per second)."""
        tokens, lengths = self.tokenizer.tokenize(source.wav_16k)
        return tuple(int(t) for t in tokens[0, : int(lengths[0])].tolist())

    # -------------------------------------------------------------------------------- request
    def validate(self, request: ConversionRequest) -> None:
        """Every check of :meth:`plan` that needs no model: the settings."""
        self._settings(request)

    def plan(self, request: ConversionRequest) -> ConversionPlan:
        """Validate ``request``, then prepare its source, resolve its target and tokenize the
        source (in that order, cheapest first). Bad input raises a ``ValueError`` subclass:
        :class:`chorus.conversion.SourceAudioError` for the source, ``AudioError`` or
        ``VoiceFormatError`` for the target."""
        settings = self._settings(request)
        source = self.prepare_source(request)
        target = self.resolve_target(request.voice)
        return ConversionPlan(tokens=self.tokenize(source), target=target, source_seconds=source.duration, **settings)

    def _settings(self, request: ConversionRequest) -> dict[str, Any]:
        flow_steps = request.flow_steps
        if flow_steps is not None and (isinstance(flow_steps, bool) or not isinstance(flow_steps, int) or flow_steps < 1):
            raise ValueError(f"flow_steps must be an integer >= 1, got {flow_steps!r}")
        seed = request.seed
        if seed is None:
            seed = secrets.randbelow(MAX_SEED + 1)
        elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, 2^64 - 1], got {seed!r}")
        if request.priority not in tuple(Priority):
            raise ValueError(f"priority must be 0 (high), 1 (normal) or 2 (low), got {request.priority!r}")
        for name in ("deadline_s", "start_deadline_s"):
            value = getattr(request, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if request.watermark is not None:
            if request.stream:
                raise ValueError("a watermark needs the whole waveform; it cannot be applied to a streamed conversion")
            from chorus.watermark import get_watermarker

            get_watermarker(request.watermark)  # fails now if the package is missing
        return dict(request_id=request.request_id or f"vc-{next(_ids)}", seed=int(seed), flow_steps=flow_steps,
                    priority=Priority(request.priority), deadline_s=request.deadline_s,
                    start_deadline_s=request.start_deadline_s, stream=bool(request.stream),
                    watermark=request.watermark)
