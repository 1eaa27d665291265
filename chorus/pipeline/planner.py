"""Validate a :class:`SpeechRequest` and plan it into chunks: the one place where a request is
shaped before any model runs.

Planning does, in order: parse the input's pauses (and SSML, ``chorus.text.markup``); check the
text and language; normalise the text for speech (numbers,
abbreviations; English only); split it into sentence-aligned chunks and tokenize each; validate
the sampling parameters against the variant (parameters it does not use are reset and listed in
``ignored``); with timestamps, find each chunk's text tokens in its text (Llama variants); check flow steps, exaggeration, priority, deadline and the watermark; resolve the
voice (built-in, voice file, or a reference clip built into a voice). Anything wrong raises a
``ValueError`` subclass (or ``chorus.text.TextError`` / ``chorus.audio.AudioError``) with a message
meant for the user, before any T3 or S3Gen work is done.
"""
from __future__ import annotations

import itertools
import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from chorus.audio.tempo import MAX_SPEED, MIN_SPEED
from chorus.engine.request import Priority
from chorus.models.random_checkpoint import random_weights_token_cap
from chorus.models.t3.alignment import alignment_heads
from chorus.models.variants import Variant
from chorus.pipeline.request import SpeechRequest
from chorus.sampling import SamplingParams
from chorus.sampling.params import MAX_SEED
from chorus.text import DEFAULT_MAX_CHARS, TextEncoder, TextInputError, split_into_chunks
from chorus.text.grapheme import GraphemeTokenizer
from chorus.text.markup import Markup, parse_markup
from chorus.timestamps.chunks import token_spans
from chorus.voices import Voice
from chorus.voices.voice import VOICE_FILE_SUFFIX

logger = logging.getLogger(__name__)

_ids = itertools.count()

TIMESTAMPS = ("word", "character")  # SpeechRequest.timestamps, besides None


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk of a request's text, ready for T3."""

    index: int
    text: str
    text_ids: tuple[int, ...]  # tokenizer output, unframed (T3 frames text itself)
    params: SamplingParams  # the request's parameters with this chunk's seed
    pause_before_s: float = 0.0  # exact silence before this chunk's audio (a break in the input)
    # with timestamps on a variant with alignment heads: per framed text token (the columns of
    # its alignment map), its characters in ``text`` (None: SOT, EOT, a token not found there)
    token_spans: tuple[tuple[int, int] | None, ...] | None = None

    @property
    def seed(self) -> int:
        return int(self.params.seed)


@dataclass(frozen=True)
class SpeechPlan:
    """A validated request: its chunks, voice and settings."""

    request_id: str
    chunks: tuple[ChunkPlan, ...]
    voice: Voice
    exaggeration: float  # 0.0 for variants without the emotion input
    flow_steps: int | None  # None: the variant's default
    priority: Priority
    deadline_s: float | None  # total: submission to the end (SpeechRequest)
    start_deadline_s: float | None  # submission to the first audio piece (SpeechRequest)
    stream: bool
    listener: str | None  # streamed requests heard one after another (SpeechRequest)
    watermark: str | None
    seed: int  # the base seed; chunk i uses seed + i
    ignored: tuple[str, ...]
    pause_after_s: float = 0.0  # exact silence after the last chunk's audio (a break ending the input)
    speed: float | None = None  # what an SSML prosody rate asks for (None: not given); applied by the caller
    timestamps: str | None = None  # SpeechRequest.timestamps

    @property
    def wants_alignment(self) -> bool:
        """T3 gives this request's chunks their alignment rows (timestamps on a Llama variant)."""
        return any(c.token_spans is not None for c in self.chunks)

    @property
    def pauses_s(self) -> tuple[float, ...]:
        """The silence before each chunk, then after the last (``len(chunks) + 1`` values)."""
        return (*(c.pause_before_s for c in self.chunks), self.pause_after_s)


def is_voice_file(source: Any) -> bool:
    """Whether a voice argument names a saved voice file (as opposed to a reference clip)."""
    return isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == VOICE_FILE_SUFFIX


def needs_voice_models(source: Any) -> bool:
    """Whether a voice argument is a reference clip, so the voice-building models must load."""
    return source is not None and not isinstance(source, Voice) and not is_voice_file(source)


def chunk_seed(base_seed: int, index: int) -> int:
    return (int(base_seed) + index) % (MAX_SEED + 1)


def _number(name: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


def plan_text(encoder: TextEncoder, text: str, language: str | None = None, *,
              max_chars: int = DEFAULT_MAX_CHARS, normalize: bool = True) -> list[tuple[str, list[int]]]:
    """``[(chunk text, T3 text ids)]`` of ``text``: checked, normalised for speech (when
    ``normalize``), split into sentence-aligned chunks of at most ``max_chars`` characters and
    tokenized (unframed). Raises a ``chorus.text.TextError`` for empty text or a missing or
    unsupported language, before any model runs."""
    if not isinstance(text, str) or not text.strip():
        raise TextInputError("text is empty; give at least one word to speak")
    language = encoder.check_language(language)
    if normalize:
        from chorus.text import normalize_for_speech

        text = normalize_for_speech(text, language)
    chunks = split_into_chunks(text, max_chars=max_chars, language=language)
    if not chunks:
        raise TextInputError("text is empty after normalisation; give at least one word to speak")
    return [(chunk, encoder.encode(chunk, language=language)) for chunk in chunks]


class RequestPlanner:
    """Plans requests for one variant.

    builtin_voice: returns the checkpoint's built-in voice (raises when it has none).
    build_voice: turns a reference clip into a voice (None when the voice models are not loaded).
    random_weights: the model has random weights: a request without ``max_new_tokens`` is capped
    (``random_weights_token_cap``), as ``chorus synth`` and ``chorus serve`` cap it.
    """

    def __init__(self, variant: Variant, text_encoder: TextEncoder, *, builtin_voice: Callable[[], Voice],
                 build_voice: Callable[[Any], Voice] | None = None, max_chars: int = DEFAULT_MAX_CHARS,
                 random_weights: bool = False, alignment: bool = False):
        self.variant = variant
        self.alignment = alignment  # the T3 engine keeps alignment queries (EngineConfig.alignment)
        self.text_encoder = text_encoder
        self._builtin_voice = builtin_voice
        self._build_voice = build_voice
        self.max_chars = max_chars
        self.random_weights = random_weights

    # ----------------------------------------------------------------------------------- text
    def plan_text(self, text: str, language: str | None = None, *, normalize: bool = True
                  ) -> list[tuple[str, list[int]]]:
        """See :func:`plan_text`."""
        return plan_text(self.text_encoder, text, language, max_chars=self.max_chars, normalize=normalize)

    def plan_markup(self, text: str, language: str | None = None, *, input_format: str = "text",
                    normalize: bool = True) -> tuple[Markup, list[tuple[str, list[int], float]]]:
        """``text`` parsed as ``input_format`` (``chorus.text.markup``) and planned segment by
        segment: ``(markup, [(chunk text, T3 text ids, pause before it in seconds)])``. A break
        ends a chunk: the text before and after it are never in one chunk."""
        markup = parse_markup(text, input_format, speed_range=(MIN_SPEED, MAX_SPEED))
        if not markup.segments:
            raise TextInputError("text is empty; give at least one word to speak")
        chunks = []
        for segment in markup.segments:
            planned = self.plan_text(segment.text, language, normalize=normalize)
            chunks += [(text, ids, segment.pause_before_s if i == 0 else 0.0) for i, (text, ids) in enumerate(planned)]
        return markup, chunks

    # --------------------------------------------------------------------------------- voices
    def resolve_voice(self, voice: Voice | Any | None) -> Voice:
        """None -> the built-in voice; a :class:`Voice` as is; a ``.safetensors`` path -> a saved
        voice; anything else -> a reference clip to build a voice from."""
        if voice is None:
            return self._builtin_voice()
        if isinstance(voice, Voice):
            return self._checked(voice)
        if is_voice_file(voice):
            return self._checked(Voice.load(voice))
        if self._build_voice is None:
            raise ValueError("the voice models are not loaded, so a voice cannot be built from a reference "
                             "clip here; pass a saved voice file (.safetensors) or load with voice models")
        return self._build_voice(voice)

    def _checked(self, voice: Voice) -> Voice:
        voice.check_variant(self.variant)
        expected = self.variant.t3.speech_cond_prompt_len
        if voice.t3_prompt_tokens.shape[1] > expected:
            logger.warning("voice %r has %d T3 prompt tokens; %s voices have at most %d (was it built for "
                           "another variant?)", voice.name, voice.t3_prompt_tokens.shape[1], self.variant.name,
                           expected)
        return voice

    # -------------------------------------------------------------------------------- request
    def validate(self, request: SpeechRequest) -> None:
        """Every check of :meth:`plan` that needs no model: all but resolving the voice. Callers
        that load models only after validating (the CLI) run this first."""
        self._settings(request)

    def plan(self, request: SpeechRequest) -> SpeechPlan:
        """Validate ``request``, resolve its voice and split it into chunks."""
        settings = self._settings(request)
        return SpeechPlan(voice=self.resolve_voice(request.voice), **settings)

    def _settings(self, request: SpeechRequest) -> dict[str, Any]:
        variant = self.variant
        markup, chunks = self.plan_markup(request.text, request.language, input_format=request.input_format,
                                          normalize=request.normalize)
        max_new_tokens, _ = random_weights_token_cap(self.random_weights, request.max_new_tokens,
                                                     request.min_new_tokens)
        params = SamplingParams.for_variant(variant, **{**request.sampling_overrides(), "max_new_tokens": max_new_tokens})
        ignored = list(params.ignored)
        flow_steps = request.flow_steps
        if flow_steps is not None and (isinstance(flow_steps, bool) or not isinstance(flow_steps, int) or flow_steps < 1):
            raise ValueError(f"flow_steps must be an integer >= 1, got {flow_steps!r}")
        if variant.t3.emotion_adv:
            exaggeration = variant.sampling.exaggeration if request.exaggeration is None else \
                _number("exaggeration", request.exaggeration, 0.0)
        else:
            if request.exaggeration:
                logger.warning("variant %s does not support exaggeration; ignoring it", variant.name)
                ignored.append("exaggeration")
            exaggeration = 0.0
        if request.priority not in tuple(Priority):
            raise ValueError(f"priority must be 0 (high), 1 (normal) or 2 (low), got {request.priority!r}")
        for name in ("deadline_s", "start_deadline_s"):
            value = getattr(request, name)
            if value is not None and _number(name, value, 0.0) <= 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        if request.listener is not None:
            if not isinstance(request.listener, str) or not request.listener:
                raise ValueError(f"listener must be a non-empty string, got {request.listener!r}")
            if not request.stream:
                raise ValueError("listener orders streamed audio; it needs stream=True")
        if request.watermark is not None:
            if request.stream:
                raise ValueError("a watermark needs the whole waveform; it cannot be applied to a streamed request")
            from chorus.watermark import get_watermarker

            get_watermarker(request.watermark)  # fails now if the package is missing
        if request.timestamps is not None and request.timestamps not in TIMESTAMPS:
            raise ValueError(f"timestamps must be one of {', '.join(TIMESTAMPS)} (or unset), got {request.timestamps!r}")
        aligned = request.timestamps is not None and self.alignment and self._aligned_spans_known()
        base_seed = int(params.seed)
        planned = tuple(ChunkPlan(i, text, tuple(ids), replace(params, seed=chunk_seed(base_seed, i)), pause,
                                  self._framed_token_spans(text, ids) if aligned else None)
                        for i, (text, ids, pause) in enumerate(chunks))
        return dict(
            request_id=request.request_id or f"speech-{next(_ids)}", chunks=planned,
            exaggeration=exaggeration, flow_steps=flow_steps, priority=Priority(request.priority),
            deadline_s=request.deadline_s, start_deadline_s=request.start_deadline_s, stream=bool(request.stream),
            listener=request.listener, watermark=request.watermark,
            seed=base_seed, ignored=tuple(sorted(set(ignored))), pause_after_s=markup.pause_after_s,
            speed=markup.speed, timestamps=request.timestamps,
        )

    def _aligned_spans_known(self) -> bool:
        """Whether timings can come from T3's attention: the backbone has the alignment heads
        and the tokenizer's tokens can be found in the text (the grapheme tokenizers)."""
        try:
            alignment_heads(self.variant.t3.backbone)
        except ValueError:
            return False
        return isinstance(self.text_encoder.tokenizer, GraphemeTokenizer)

    def _framed_token_spans(self, text: str, ids: list[int]) -> tuple[tuple[int, int] | None, ...]:
        tokenizer = self.text_encoder.tokenizer
        spans = token_spans(text, [tokenizer.decode([i]) for i in ids])
        return (None, *spans, None)  # SOT and EOT frame the text (``TextEncoder.encode_framed``)
