"""Joining the chunks of one request, the same way on every path.

Each chunk's waveform already starts with S3Gen's 20 ms of silence and 20 ms fade-in, so chunks
are joined end to end; the pipeline streams the same samples in the same order.

A pause (a break in the input, docs/pauses.md) is exact silence: ``pause_samples(seconds)``
zeros at the output rate, put between the end of the audio before it and the start of the audio
after it. Nothing is cross-faded across it and nothing of either side is cut.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from chorus.models.s3gen.s3gen import SAMPLE_RATE


def pause_samples(seconds: float) -> int:
    """Samples of silence of a pause of ``seconds`` at the pipeline's rate (rounded)."""
    return int(round(seconds * SAMPLE_RATE))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(pause_samples(seconds), np.float32)


def stitch_chunks(pieces: Sequence[np.ndarray], pauses_s: Sequence[float] = ()) -> np.ndarray:
    """The request's waveform: its chunks' waveforms, in order, with ``pauses_s[i]`` seconds of
    silence before chunk ``i`` and ``pauses_s[-1]`` after the last (``SpeechPlan.pauses_s``;
    empty: none)."""
    parts: list[np.ndarray] = []
    for i, piece in enumerate(pieces):
        if pauses_s and pauses_s[i]:
            parts.append(silence(pauses_s[i]))
        parts.append(piece)
    if pauses_s and pauses_s[-1]:
        parts.append(silence(pauses_s[-1]))
    if not parts:
        return np.zeros(0, np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)


def pause_spans(chunk_samples: Sequence[int], pauses_s: Sequence[float]) -> tuple[tuple[int, int], ...]:
    """Where the pauses lie in the stitched waveform: ``(first sample, samples)`` of each pause
    that lasts at least one sample, in order, given each chunk's length in samples."""
    spans: list[tuple[int, int]] = []
    at = 0
    for i, seconds in enumerate(pauses_s):
        length = pause_samples(seconds)
        if length:
            spans.append((at, length))
        at += length + (chunk_samples[i] if i < len(chunk_samples) else 0)
    return tuple(spans)


def chunk_span(chunk_samples: Sequence[int], pauses_s: Sequence[float]) -> tuple[int, int]:
    """Where the last of ``chunk_samples`` lies in the stitched waveform: its first sample and
    the sample after its end, given the lengths of it and every chunk before it."""
    at = start = 0
    for i, length in enumerate(chunk_samples):
        at += pause_samples(pauses_s[i]) if pauses_s else 0
        start = at
        at += length
    return start, at
