"""A chunk's timings from what the pipeline has: its text, its text tokens' characters, its
speech tokens' alignment rows (Llama T3) and its exact span in the delivered audio.

``token_spans`` finds each text token's characters in the chunk's text from the token's own
string (the tokenizers do not report offsets); ``chunk_timings`` picks the method: ``alignment``
when there is a map and every word of the chunk is covered by a token, else ``estimate`` (a
tokenizer that rewrites the text, e.g. the multilingual one's NFKD or its Chinese step, leaves
words uncovered). ``at_speed`` moves timings to a response played ``speed`` times faster, where
the pauses keep their length; ``shifted`` moves them later in a response that holds more audio.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import torch

from chorus.timestamps import ChunkTimings, estimate, from_alignment, split_words

# how far past the end of the previous token a token's string may start (spaces the tokenizer
# dropped); further away it is taken as not found
_MAX_SKIP = 2


def token_spans(text: str, pieces: Sequence[str | None]) -> list[tuple[int, int] | None]:
    """Each token's characters ``[start, end)`` in ``text``, found in order from its string
    (case-insensitively); None for a token whose string is not where the text continues (a
    language tag, a rewritten character, framing)."""
    lowered = text.lower()
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for piece in pieces:
        if not piece:
            spans.append(None)
            continue
        at = lowered.find(piece.lower(), cursor, cursor + _MAX_SKIP + len(piece))
        if at < 0:
            spans.append(None)
            continue
        spans.append((at, at + len(piece)))
        cursor = at + len(piece)
    return spans


def chunk_timings(text: str, span: tuple[float, float], alignment: torch.Tensor | None = None,
                  spans: Sequence[tuple[int, int] | None] | None = None) -> ChunkTimings:
    """The chunk's timings within ``span`` (seconds of the pipeline's audio): from ``alignment``
    (``[speech tokens, framed text tokens]``, ``spans`` per column) when every word is covered
    by a token, else estimated."""
    if alignment is not None and spans is not None and _covers(text, spans):
        return from_alignment(text, alignment, spans, span)
    return estimate(text, span)


def _covers(text: str, spans: Sequence[tuple[int, int] | None]) -> bool:
    return all(any(s is not None and s[0] < end and s[1] > start for s in spans)
               for start, end in split_words(text))


def at_speed(timings: ChunkTimings, silence_before_s: float, speed: float) -> ChunkTimings:
    """``timings`` (seconds of the pipeline's audio, with ``silence_before_s`` seconds of pauses
    before its chunk) in a response played ``speed`` times faster, whose pauses keep their
    length: ``t -> silence + (t - silence) / speed``."""
    if speed == 1.0:
        return timings
    return _moved(timings, lambda t: silence_before_s + (t - silence_before_s) / speed)


def shifted(timings: ChunkTimings, offset_s: float) -> ChunkTimings:
    """``timings`` moved ``offset_s`` seconds later (a request's audio that follows other audio in
    one response, e.g. a piece of a WebSocket turn)."""
    if offset_s == 0.0:
        return timings
    return _moved(timings, lambda t: t + offset_s)


def _moved(timings: ChunkTimings, move: Callable[[float], float]) -> ChunkTimings:
    return ChunkTimings(timings.method,
                        tuple(replace(w, start=move(w.start), end=move(w.end)) for w in timings.words),
                        tuple(replace(c, start=move(c.start), end=move(c.end)) for c in timings.characters))
