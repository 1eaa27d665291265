"""One request as the pipeline's vocoder thread tracks it: its chunks' jobs (tokens from T3,
audio from the vocoder stage), its two deadlines, the moments its timings are read from, the
in-order delivery of its audio to its stream, and the release of its jobs once it has ended.

Only the vocoder thread reads or writes these (``Pipeline`` makes them on the caller's thread and
hands them over through its inbox); nothing here touches T3 or another request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from chorus.models.s3gen.s3gen import SAMPLE_RATE, TokenRules
from chorus.pipeline.planner import SpeechPlan
from chorus.pipeline.stitch import chunk_span, silence
from chorus.pipeline.stream import AudioPiece, SpeechStream
from chorus.timestamps import ChunkTimings
from chorus.timestamps.chunks import chunk_timings

if TYPE_CHECKING:
    from chorus.conversion.planner import ConversionPlan
    from chorus.vocoder import VocoderStage


@dataclass(frozen=True)
class Progress:
    """One chunk finished (passed to ``generate``'s ``progress`` callback)."""

    request_id: str
    chunk_index: int
    audio_seconds: float  # of that chunk


@dataclass
class ChunkJob:
    """One chunk of one request, as the vocoder thread tracks it."""

    request: "RequestState"
    index: int
    tokens: list[int] = field(default_factory=list)
    pushed: int = 0  # tokens already handed to the stage (streaming jobs)
    t3_reason: str | None = None  # set when T3 finished the chunk
    # a streamed request's first chunk, until its first vocoder pass is ready: when T3 made each
    # token not yet pushed (``RequestState.first_window`` is read from these)
    stamps: list[float] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)  # each token's alignment row (when asked)
    pieces: list[np.ndarray] = field(default_factory=list)  # audio not yet streamed out
    delivered: list[np.ndarray] = field(default_factory=list)  # audio already streamed out
    done: bool = False

    @property
    def samples(self) -> int:
        """Samples of audio made so far (``waveform().size`` without joining the pieces)."""
        return sum(piece.size for piece in self.delivered) + sum(piece.size for piece in self.pieces)

    def waveform(self) -> np.ndarray:
        parts = self.delivered + self.pieces
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def push_to_first_window(self, vocoder: "VocoderStage", job_id: str, final: bool) -> None:
        """Push a stream's first chunk's new tokens one at a time until its first pass is ready,
        and stamp that with the T3 step that made the token completing it (``first_window``). A
        final chunk's last token is left to go with ``final``, which readies its last pass."""
        assert len(self.stamps) == len(self.tokens) - self.pushed, (len(self.stamps), len(self.tokens), self.pushed)
        for stamp in self.stamps[:-1] if final else self.stamps:
            vocoder.push(job_id, self.tokens[self.pushed:self.pushed + 1])
            self.pushed += 1
            if vocoder.is_ready(job_id):
                self.request.first_window = stamp
                break
        else:
            if final:
                self.request.first_window = self.stamps[-1]
        self.stamps = []

    def alignment(self, rules: TokenRules) -> torch.Tensor | None:
        """The chunk's alignment map, one row per token that reaches the audio (S3Gen's token
        rules drop the others, so row k is the token at k / 25 s), or None without rows."""
        if not self.rows or len(self.rows) != len(self.tokens):
            return None
        kept: list[torch.Tensor] = []
        saw_bos = saw_eos = False
        for token, row in zip(self.tokens, self.rows):
            if rules.cut_at_markers:
                if token == rules.bos and not saw_bos:
                    saw_bos = True
                    kept.clear()
                    continue
                if saw_eos:
                    continue
                if token == rules.eos:
                    saw_eos = True
                    continue
            if 0 <= token < rules.num_codes:
                kept.append(row)
        return torch.stack(kept) if kept else self.rows[0].new_zeros((0, self.rows[0].shape[-1]))


@dataclass(frozen=True)
class Deadlines:
    """A request's two deadlines, in seconds from ``submitted`` (``time.monotonic()``): the
    start deadline until its first audio piece is delivered (it stops applying then), the
    total deadline until its end. None: no such deadline."""

    submitted: float
    start_s: float | None
    total_s: float | None

    def expired(self, now: float, audio_started: bool) -> tuple[str, str] | None:
        """(which deadline passed: ``"start"`` or ``"total"``, why) when the request must be
        failed now, else None."""
        if self.start_s is not None and not audio_started and now > self.submitted + self.start_s:
            return "start", f"no audio within its start deadline ({self.start_s:g} s)"
        if self.total_s is not None and now > self.submitted + self.total_s:
            return "total", f"not finished within its total deadline ({self.total_s:g} s)"
        return None


@dataclass
class RequestState:
    plan: SpeechPlan | ConversionPlan
    stream: SpeechStream
    jobs: list[ChunkJob]
    deadlines: Deadlines
    progress: Callable[[Progress], None] | None = None
    next_chunk: int = 0  # first chunk not yet fully delivered
    first_token: float | None = None  # T3's first token of the first chunk
    first_window: float | None = None  # T3's step that gave a stream's first vocoder pass its tokens
    first_pass: float | None = None  # start of the vocoder pass that made its first audio
    first_audio: float | None = None
    audio_started: bool = False  # a piece with samples was delivered to the stream
    pauses_s: tuple[float, ...] = ()  # SpeechPlan.pauses_s (empty: none)
    pauses_sent: int = 0  # pauses before chunks (SpeechPlan.pauses_s) already streamed out
    token_rules: TokenRules | None = None  # the variant's, for requests with timestamps
    _timings: dict[int, ChunkTimings] = field(default_factory=dict)  # of done chunks, made once

    @property
    def submitted(self) -> float:
        """``time.monotonic()`` when the pipeline took it (its stream says, for the caller too)."""
        return self.stream.submitted_at

    def job_id(self, index: int) -> str:
        return f"{self.plan.request_id}#{index}"

    def deliver_in_order(self) -> None:
        """Stream what can go out now: the pieces of the first undelivered chunk, then, once it
        is done, the next chunk's buffered pieces, and so on. A pause before a chunk goes out as
        soon as the chunk before it is done (the first chunk's with its first audio); the pause
        after the last chunk is then the final piece (``stitch_chunks`` joins the same way)."""
        last = len(self.jobs) - 1
        trailing = bool(self.pauses_s and self.pauses_s[-1])
        while self.next_chunk <= last:
            job = self.jobs[self.next_chunk]
            if self.pauses_sent == self.next_chunk and (self.next_chunk > 0 or job.pieces):
                self._put_pause(self.next_chunk, job.index, False)
            timings = self.chunk_timings(job.index) if job.done and self.wants_timestamps else None
            for i, samples in enumerate(job.pieces):
                ends_chunk = job.done and i == len(job.pieces) - 1
                final = ends_chunk and self.next_chunk == last and not trailing
                if samples.size or final or (ends_chunk and timings is not None):
                    self.audio_started = self.audio_started or samples.size > 0
                    self.stream._put_audio(AudioPiece(samples, job.index, final,
                                                      timings=timings if ends_chunk else None))
            job.delivered += job.pieces
            job.pieces = []
            if not job.done:
                return
            self.next_chunk += 1
        if trailing:
            self._put_pause(last + 1, self.jobs[last].index, True)

    @property
    def wants_timestamps(self) -> bool:
        return getattr(self.plan, "timestamps", None) is not None

    def chunk_timings(self, index: int) -> ChunkTimings:
        """Chunk ``index``'s timings in seconds of the request's audio (its job and every job
        before it done): its exact span after the chunks and pauses before it. Made once: the
        streamed piece that ends the chunk and the whole result share it."""
        if index in self._timings:
            return self._timings[index]
        start, end = chunk_span([j.samples for j in self.jobs[:index + 1]], self.pauses_s)
        chunk = self.plan.chunks[index]
        alignment = None
        if chunk.token_spans is not None and self.token_rules is not None:
            alignment = self.jobs[index].alignment(self.token_rules)
        timings = chunk_timings(chunk.text, (start / SAMPLE_RATE, end / SAMPLE_RATE), alignment, chunk.token_spans)
        self._timings[index] = timings
        return timings

    def _put_pause(self, slot: int, chunk_index: int, final: bool) -> None:
        """Stream the pause of ``pauses_s[slot]`` (nothing when it is none)."""
        self.pauses_sent = slot + 1
        if self.pauses_s and self.pauses_s[slot]:
            self.audio_started = True
            self.stream._put_audio(AudioPiece(silence(self.pauses_s[slot]), chunk_index, final, pause=True))

    def timings(self, now: float) -> dict[str, float]:
        """The result's ``timings`` for a request ending at ``now`` (``SpeechResult.timings``)."""
        timings = {"total_s": now - self.submitted}
        if self.first_token is not None:
            timings["first_token_s"] = self.first_token - self.submitted
        if self.first_window is not None:
            timings["first_window_s"] = self.first_window - self.submitted
        if self.first_audio is not None:
            timings["first_pass_s"] = self.first_pass - self.submitted
            timings["first_audio_s"] = self.first_audio - self.submitted
        return timings

    def release(self) -> None:
        """Drop an ended request's jobs. Each job points back at its request, so while the
        request lists them the two make a reference cycle, which only the cyclic collector frees
        (with the request's audio and stream); its full collections stop every thread of the
        process. Once the request has ended nothing reaches its jobs (they have left the vocoder
        thread's table), so this lets reference counting free them at once."""
        self.jobs = []
