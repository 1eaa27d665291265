"""Word and character timings of one text chunk inside its exact audio span.

Two methods, and every result names its own:

- ``alignment`` (Llama T3: original, multilingual): from the chunk's alignment map
  (``chorus.models.t3.alignment``), one row per speech token, one column per framed text token.
  Each speech token is placed on the text token it attends most, never moving back; a word
  starts at the first speech token placed on one of its text tokens. Speech token ``k`` starts
  ``k / (25 * speed)`` seconds into the span (25 speech tokens per second of audio, played
  ``speed`` times faster).
- ``estimate`` (GPT-2 T3: Turbo, Nano, whose alignment heads are not known): the span is shared
  out by the characters of each word plus a pause after punctuation.

Either way the timings are monotonic, inside the span, and every word (and every character of a
word) gets an interval of positive length. Characters share their word's interval evenly.
The chunk's span (start and end in the response, after stitching, cross-fades and ``speed``) is
the caller's: these functions never move a chunk boundary.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from chorus.models.speech_tokens import TOKENS_PER_SECOND

Method = Literal["alignment", "estimate"]

# extra weight of the pause after a word that ends in punctuation, in characters (estimate)
CLAUSE_PAUSE_CHARS = 2.0  # , ; : and their CJK forms
SENTENCE_PAUSE_CHARS = 4.0  # . ! ? and their CJK forms
_CLAUSE_END = set(",;:\u3001\uff0c\uff1b\uff1a")
_SENTENCE_END = set(".!?\u3002\uff01\uff1f\u2026")
# a CJK ideograph, kana or hangul syllable is a word of its own (those scripts have no spaces)
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(f"[{_CJK}][^\\s{_CJK}\\w]*|[^\\s{_CJK}]+")


@dataclass(frozen=True)
class Timing:
    """One word or character: its text, its characters ``[char_start, char_end)`` in the chunk's
    text, and its interval in seconds from the start of the response."""

    text: str
    char_start: int
    char_end: int
    start: float
    end: float


@dataclass(frozen=True)
class ChunkTimings:
    method: Method
    words: tuple[Timing, ...]
    characters: tuple[Timing, ...]


def split_words(text: str) -> list[tuple[int, int]]:
    """The words of ``text`` as character spans ``[start, end)``: runs of non-space characters
    (punctuation stays with its word), and each CJK character with the punctuation after it."""
    return [m.span() for m in _WORD.finditer(text)]


def word_columns(words: Sequence[tuple[int, int]], token_spans: Sequence[tuple[int, int] | None]
                 ) -> list[tuple[int, int]]:
    """Each word's text-token columns ``[first, last + 1)`` in an alignment map.

    ``token_spans``: per column of the map, the characters ``[start, end)`` of the chunk's text
    that the text token covers, or None for tokens that cover none (SOT, EOT). A word's columns
    are the tokens that overlap it; a word no token overlaps (never, for a tokenizer that covers
    the text) takes the column after its predecessor's."""
    columns = []
    previous_end = next((i for i, s in enumerate(token_spans) if s is not None), 0)
    for start, end in words:
        hits = [i for i, s in enumerate(token_spans) if s is not None and s[0] < end and s[1] > start]
        first, last = (hits[0], hits[-1] + 1) if hits else (previous_end, previous_end + 1)
        columns.append((first, last))
        previous_end = last
    return columns


def from_alignment(text: str, alignment: torch.Tensor, token_spans: Sequence[tuple[int, int] | None],
                   span: tuple[float, float], speed: float = 1.0) -> ChunkTimings:
    """Timings of ``text`` from its chunk's alignment map ``[speech tokens, text tokens]``
    (``token_spans`` as :func:`word_columns` takes them) within ``span`` = (start, end) seconds."""
    _check_span(span, speed)
    if alignment.ndim != 2 or alignment.shape[1] != len(token_spans):
        raise ValueError(f"the alignment map is {list(alignment.shape)}, expected [speech tokens, "
                         f"{len(token_spans)} text tokens]")
    words = split_words(text)
    if not words:
        return ChunkTimings("alignment", (), ())
    num_tokens = alignment.shape[0]
    if num_tokens == 0:
        return _timings("alignment", text, words, _even_bounds(len(words), 0.0, 0.0), span, speed)
    # where each speech token is in the text: the most attended token, never moving back
    placed = torch.cummax(alignment.float().argmax(dim=1), dim=0).values.tolist()
    columns = word_columns(words, token_spans)
    starts = [next((k for k, p in enumerate(placed) if p >= first), num_tokens) for first, _ in columns]
    last_end = next((k for k, p in enumerate(placed) if p >= columns[-1][1]), num_tokens)
    bounds = [float(s) for s in starts] + [float(max(last_end, starts[-1]))]
    return _timings("alignment", text, words, bounds, span, speed)


def estimate(text: str, span: tuple[float, float]) -> ChunkTimings:
    """Timings of ``text`` shared out over ``span`` by characters and punctuation pauses."""
    _check_span(span, 1.0)
    words = split_words(text)
    if not words:
        return ChunkTimings("estimate", (), ())
    weights = [float(end - start) + _pause(text[end - 1]) for start, end in words]
    bounds = [0.0]
    for weight in weights:
        bounds.append(bounds[-1] + weight)
    duration = span[1] - span[0]
    scaled = [b / bounds[-1] * duration * TOKENS_PER_SECOND for b in bounds]  # in token units
    return _timings("estimate", text, words, scaled, span, 1.0)


def _pause(last_char: str) -> float:
    if last_char in _SENTENCE_END:
        return SENTENCE_PAUSE_CHARS
    return CLAUSE_PAUSE_CHARS if last_char in _CLAUSE_END else 0.0


def _check_span(span: tuple[float, float], speed: float) -> None:
    if not 0.0 <= span[0] <= span[1]:
        raise ValueError(f"a chunk's span must satisfy 0 <= start <= end, got {span}")
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")


def _even_bounds(count: int, start: float, end: float) -> list[float]:
    return [start + (end - start) * i / count for i in range(count + 1)]


def _timings(method: Method, text: str, words: list[tuple[int, int]], bounds: list[float],
             span: tuple[float, float], speed: float) -> ChunkTimings:
    """``bounds``: n + 1 nondecreasing word boundaries in speech tokens from the span's start.
    Seconds = start + tokens / (25 * speed), clamped into the span; words squeezed to nothing
    (a skipped word, or the span's end) share the interval of the next word that has one."""
    start, end = span
    seconds = [min(end, start + b / (TOKENS_PER_SECOND * speed)) for b in bounds]
    seconds = _spread_empty(seconds, [e - s for s, e in words], end)
    word_timings, char_timings = [], []
    for (a, b), t0, t1 in zip(words, seconds, seconds[1:]):
        word_timings.append(Timing(text[a:b], a, b, t0, t1))
        step = (t1 - t0) / (b - a)
        char_timings += [Timing(text[i], i, i + 1, t0 + step * (i - a), t0 + step * (i - a + 1))
                         for i in range(a, b)]
    return ChunkTimings(method, tuple(word_timings), tuple(char_timings))


def _spread_empty(bounds: list[float], lengths: list[int], span_end: float) -> list[float]:
    """Boundaries where every word has a positive interval (unless the span is empty): a run of
    words with empty intervals shares, by characters, the interval of the first non-empty one
    after it; a run at the end shares the last non-empty interval before it (when nothing is
    non-empty, the whole run shares what is left up to ``span_end``)."""
    n = len(lengths)
    out = list(bounds)
    i = 0
    while i < n:
        if out[i + 1] > out[i]:
            i += 1
            continue
        j = i
        while j < n and out[j + 1] <= out[j]:
            j += 1
        if j < n:  # words i..j share [out[i], out[j + 1])
            first, last = i, j
        else:  # trailing run: take the last non-empty word before it along
            first = i - 1 if i > 0 else i
            last = n - 1
            if first == i:  # nothing has an interval: the run gets what is left of the span
                out[n] = max(out[n], span_end)
        lo, hi = out[first], out[last + 1]
        total = sum(lengths[first:last + 1])
        acc = 0
        for w in range(first, last):
            acc += lengths[w]
            out[w + 1] = lo + (hi - lo) * acc / total
        i = last + 1
    return out
