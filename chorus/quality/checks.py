"""Per-request audio checks, cheap enough for every request (docs/quality.md, "Per-request checks").

:class:`AudioCheck` reads the audio pieces the server already holds as they are delivered
(vectorised numpy over each piece, no extra model, no host sync: the samples are on the host
already) and, once the request has ended, :meth:`AudioCheck.report` adds what needs the whole
request: the audio seconds per input character and the longest loop of speech tokens.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

SAMPLE_RATE = 24_000
FRAME_SAMPLES = 480  # 20 ms frames for the silent fraction
SILENT_FRAME_DBFS = -50.0  # a frame quieter than this (RMS) is silent
CLIP_LEVEL = 0.999  # a sample at or above this magnitude is clipped (pcm16 saturates at 1.0)
MAX_LOOP_PERIOD = 16  # n-grams up to this many tokens are looked for in loops

# why a request is flagged (the `reason` label of chorus_audio_flagged_requests)
REASONS = ("nonfinite", "clipped", "silent", "too_long", "too_short", "loop")


@dataclass(frozen=True)
class Thresholds:
    """When a request is flagged (docs/quality.md says how each was chosen).

    clipped_ratio: share of samples at full scale above which a request is flagged ``clipped``.
    silent_ratio: share of 20 ms frames below -50 dBFS above which it is flagged ``silent``.
    ratio_factor: audio seconds per character outside [expected / f, expected * f] is flagged
    ``too_short`` / ``too_long``; only for texts of at least ``ratio_min_chars`` characters.
    loop_tokens: a stretch of at least this many speech tokens that repeats one n-gram
    (n <= 16) back to back is flagged ``loop`` (50 tokens: two seconds).
    """

    clipped_ratio: float = 0.001
    silent_ratio: float = 0.6
    ratio_factor: float = 4.0
    ratio_min_chars: int = 20
    loop_tokens: int = 50


@dataclass(frozen=True)
class QualityReport:
    """One request's checks. ``seconds_per_char`` and ``loop_tokens`` are None where they do not
    apply (a voice conversion has no text and no T3 tokens)."""

    audio_seconds: float
    clipped_ratio: float
    silent_ratio: float
    rms_dbfs: float
    seconds_per_char: float | None
    loop_tokens: int | None
    flags: tuple[str, ...]

    def as_dict(self) -> dict:
        """For a client (the SSE and WebSocket ``done`` messages)."""
        out = asdict(self)
        out["flags"] = list(self.flags)
        for key in ("audio_seconds", "clipped_ratio", "silent_ratio", "rms_dbfs", "seconds_per_char"):
            if out[key] is not None:
                out[key] = round(out[key], 6) if math.isfinite(out[key]) else None
        return out


def dbfs(mean_square: float) -> float:
    """RMS level in dB relative to full scale (-inf for silence)."""
    return 10 * math.log10(mean_square) if mean_square > 0 else -math.inf


class AudioCheck:
    """The running checks of one request's audio (one writer: whoever delivers its pieces)."""

    def __init__(self) -> None:
        self.samples = 0
        self.clipped = 0
        self.square_sum = 0.0
        self.frames = 0
        self.silent_frames = 0
        self.nonfinite = False
        self._carry = np.zeros(0, np.float32)  # samples of a frame not yet complete
        self._silent_square = FRAME_SAMPLES * 10 ** (SILENT_FRAME_DBFS / 10)

    def add(self, samples: np.ndarray) -> bool:
        """Account for the next piece; False (and nothing counted) when it is not finite: NaN or
        inf must never be sent."""
        if samples.size == 0:
            return True
        if not np.isfinite(samples).all():
            self.nonfinite = True
            return False
        x = samples.astype(np.float32, copy=False)
        self.samples += x.size
        self.clipped += int(np.count_nonzero(np.abs(x) >= CLIP_LEVEL))
        self.square_sum += float(np.dot(x, x))
        framed = np.concatenate([self._carry, x]) if self._carry.size else x
        whole = framed.size // FRAME_SAMPLES * FRAME_SAMPLES
        if whole:
            frames = framed[:whole].reshape(-1, FRAME_SAMPLES)
            energy = np.einsum("ij,ij->i", frames, frames)
            self.frames += frames.shape[0]
            self.silent_frames += int(np.count_nonzero(energy < self._silent_square))
        self._carry = framed[whole:].copy()
        return True

    def report(self, *, text_chars: int | None, tokens: Sequence[Sequence[int]] | None,
               expected_seconds_per_char: float, thresholds: Thresholds = Thresholds()) -> QualityReport:
        """The request's checks once it has ended. ``text_chars``: its input's length (None: no
        text); ``tokens``: each chunk's speech tokens (None: not T3's); ``expected_seconds_per_char``:
        what the model speaks per character (the server's ``tokens_per_char`` / 25)."""
        frames, silent = self.frames, self.silent_frames
        if self._carry.size:  # the last partial frame counts as one
            frames += 1
            silent += int(float(np.dot(self._carry, self._carry)) / self._carry.size * FRAME_SAMPLES
                          < self._silent_square)
        seconds = self.samples / SAMPLE_RATE
        clipped = self.clipped / self.samples if self.samples else 0.0
        silent_ratio = silent / frames if frames else 1.0
        rms = dbfs(self.square_sum / self.samples) if self.samples else -math.inf
        per_char = seconds / text_chars if text_chars else None
        loop = max((longest_loop(chunk) for chunk in tokens), default=0) if tokens is not None else None
        flags = []
        if self.nonfinite:
            flags.append("nonfinite")
        if clipped > thresholds.clipped_ratio:
            flags.append("clipped")
        if silent_ratio > thresholds.silent_ratio:
            flags.append("silent")
        if per_char is not None and text_chars >= thresholds.ratio_min_chars:
            if per_char > expected_seconds_per_char * thresholds.ratio_factor:
                flags.append("too_long")
            elif per_char < expected_seconds_per_char / thresholds.ratio_factor:
                flags.append("too_short")
        if loop is not None and loop >= thresholds.loop_tokens:
            flags.append("loop")
        return QualityReport(seconds, clipped, silent_ratio, rms, per_char, loop, tuple(flags))


def longest_loop(tokens: Sequence[int], max_period: int = MAX_LOOP_PERIOD) -> int:
    """The length in tokens of the longest stretch that repeats one n-gram back to back
    (n <= ``max_period``), counting only stretches that hold it at least three times; 0 if none.
    A held token (n = 1) counts: a model stuck on one token is the commonest loop."""
    x = np.asarray(tokens, dtype=np.int64)
    best = 0
    for n in range(1, min(max_period, x.size // 3) + 1):
        same = x[n:] == x[:-n]  # same[i]: token i + n repeats token i
        run = _longest_true_run(same)
        span = run + n  # a run of r repeats at period n covers r + n tokens
        if run and span >= 3 * n:
            best = max(best, span)
    return best


def _longest_true_run(mask: np.ndarray) -> int:
    if not mask.any():
        return 0
    padded = np.concatenate([[False], mask, [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])  # starts and ends of the runs, interleaved
    return int((edges[1::2] - edges[0::2]).max())
