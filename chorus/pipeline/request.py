"""What a caller asks of the speech pipeline, and what it gets back.

A :class:`SpeechRequest` is the one typed description of a request, whoever makes it (the CLI,
the Python API, the HTTP server): text, voice, language, per-request parameters, priority,
deadline and whether audio should stream. Unset (None) parameters take the variant's defaults.
:class:`chorus.pipeline.planner.RequestPlanner` validates it and plans it into chunks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from chorus.engine.request import Priority
from chorus.timestamps import ChunkTimings

if TYPE_CHECKING:  # the builder pulls in the audio stack; only its type is needed here
    from chorus.voices.builder import VoiceSource
    from chorus.voices.voice import Voice


@dataclass
class SpeechRequest:
    """One text to speak.

    voice: None (the checkpoint's built-in voice), a :class:`Voice`, a ``.safetensors`` voice
    file, or a reference clip (path, bytes, file object) to build a voice from.
    seed: chunk ``i`` of the text is sampled with ``seed + i`` (T3 and S3Gen); None draws one.
    max_new_tokens / min_new_tokens bound each chunk's speech tokens (25 per second of audio).
    flow_steps: S3Gen solver steps (default: the variant's, 10 or meanflow's 2).
    deadline_s: the *total* deadline: seconds from submission until the request is failed
    wherever it is, even while its audio flows (None: the pipeline's ``default_deadline_s``).
    start_deadline_s: the *start* deadline: seconds from submission until its first audio piece
    is delivered; once audio flows it no longer applies (None: the pipeline's
    ``default_start_deadline_s``). A non-streaming request delivers its audio at the end, so
    for it the start deadline bounds the whole request.
    stream: deliver audio while it is generated (see ``SpeechStream``).
    listener: streamed requests with the same ``listener`` are heard one after another, in the
    order they were submitted (a voice-agent turn's pieces): a later one's audio is scheduled
    for when the audio before it runs out, not as urgently as a new stream's first audio. A
    request's own chunks are always heard that way. Never changes the audio.
    normalize: spell out numbers and abbreviations the model would misread (English only).
    input_format: ``"text"`` (plain text; ``<break time="500ms"/>`` inserts a pause) or
    ``"ssml"`` (the SSML subset of docs/pauses.md); ``chorus.text.markup`` parses both.
    timestamps: None (off, costs nothing), ``"word"`` or ``"character"``: time each chunk's
    words and characters (docs/timestamps.md); the result's ``timestamps`` and, when streaming,
    the last piece of each chunk carry them (both granularities; the value says which a caller
    reports).
    """

    text: str
    voice: "Voice | VoiceSource | None" = None
    language: str | None = None
    exaggeration: float | None = None
    cfg_weight: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    min_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    flow_steps: int | None = None
    watermark: str | None = None
    priority: int = Priority.NORMAL
    deadline_s: float | None = None
    start_deadline_s: float | None = None
    stream: bool = False
    listener: str | None = None
    normalize: bool = True
    input_format: str = "text"
    timestamps: str | None = None
    request_id: str | None = None

    def sampling_overrides(self) -> dict[str, Any]:
        """The T3 sampling parameters of this request (None = the variant's default)."""
        return dict(temperature=self.temperature, top_p=self.top_p, min_p=self.min_p, top_k=self.top_k,
                    repetition_penalty=self.repetition_penalty, cfg_weight=self.cfg_weight, seed=self.seed,
                    max_new_tokens=self.max_new_tokens, min_new_tokens=self.min_new_tokens)


@dataclass(frozen=True)
class ChunkResult:
    """What happened to one chunk of the text."""

    text: str
    seed: int
    speech_tokens: int  # tokens T3 generated (before S3Gen's clean-up)
    finish_reason: str  # "eos", "length" or "exhausted" (no token could be sampled)
    num_samples: int
    tokens: tuple[int, ...] = ()  # those tokens (the quality checks look for loops in them)


@dataclass(frozen=True)
class SpeechResult:
    """A finished request: its whole waveform and what each chunk did."""

    wav: np.ndarray  # (samples,) float32 in [-1, 1]
    sample_rate: int
    seed: int
    chunks: tuple[ChunkResult, ...]
    ignored: tuple[str, ...] = ()  # parameters the variant does not use (reset, as the reference does)
    request_id: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds from the request's submission to the pipeline: ``total_s`` (its end), and where
    they happened, ``first_token_s`` (T3's step that made its first token), ``first_window_s``
    (streamed requests: T3's step that made the last token its first vocoder pass needed),
    ``first_pass_s`` (the start of the vocoder pass that made its first audio) and
    ``first_audio_s`` (that pass's end)."""
    pauses: tuple[tuple[int, int], ...] = ()
    """Where the input's breaks lie in ``wav``: ``(first sample, samples)`` of each, in order;
    every sample of a pause is exactly 0 (docs/pauses.md)."""
    timestamps: tuple[ChunkTimings, ...] = ()
    """With ``SpeechRequest.timestamps``: each chunk's timings, in seconds of ``wav``, in order."""

    @property
    def duration(self) -> float:
        return len(self.wav) / self.sample_rate
