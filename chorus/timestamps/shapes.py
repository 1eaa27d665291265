"""Timings as the front doors send them (docs/timestamps.md, "Using it"): one owner for which
words and characters go out and how their seconds are rounded.

HTTP: ``character``: ElevenLabs' ``alignment`` shape, ``{"characters",
"character_start_times_seconds", "character_end_times_seconds"}``, whose characters joined give
the spoken text (the chunks' texts joined by a space); a space or another character outside the
words gets the gap between its neighbours. ``word``: ``[{"word", "start", "end"}]``.
The WebSocket: the same words and characters as Cartesia's parallel lists
(``word_lists``, ``character_lists``). gRPC: Riva's ``WordTiming`` in whole milliseconds
(``words_ms``). ``method``: ``alignment`` only when every chunk was timed from the model's
attention, else ``estimate``.
"""
from __future__ import annotations

from typing import Sequence

from chorus.timestamps import ChunkTimings

# seconds are rounded to this many decimals (a tenth of a millisecond; audio samples are 1/24000 s)
DECIMALS = 4


def method(chunks: Sequence[ChunkTimings]) -> str:
    return "alignment" if chunks and all(c.method == "alignment" for c in chunks) else "estimate"


def words(chunks: Sequence[ChunkTimings]) -> list[dict]:
    return [{"word": w.text, "start": round(w.start, DECIMALS), "end": round(w.end, DECIMALS)}
            for chunk in chunks for w in chunk.words]


def word_lists(chunks: Sequence[ChunkTimings]) -> dict:
    """The words as Cartesia's ``word_timestamps``: ``{"words", "start", "end"}``, parallel lists."""
    listed = words(chunks)
    return {"words": [w["word"] for w in listed], "start": [w["start"] for w in listed],
            "end": [w["end"] for w in listed]}


def words_ms(chunks: Sequence[ChunkTimings]) -> list[tuple[str, int, int]]:
    """The words as Riva's ``WordTiming`` has them: (word, start, end) in whole milliseconds."""
    return [(w.text, round(w.start * 1000), round(w.end * 1000)) for chunk in chunks for w in chunk.words]


def characters(texts: Sequence[str], chunks: Sequence[ChunkTimings], *, leading_space: bool = False) -> dict:
    """The characters of ``texts`` (each with its chunk's timings), joined by a space (and led
    by one with ``leading_space``: a streamed chunk after the first)."""
    letters: list[str] = []
    times: list[tuple[float, float] | None] = []
    for n, (text, chunk) in enumerate(zip(texts, chunks)):
        if n or leading_space:
            letters.append(" ")
            times.append(None)
        timed = {c.char_start: (c.start, c.end) for c in chunk.characters}
        for i, letter in enumerate(text):
            letters.append(letter)
            times.append(timed.get(i))
    starts, ends = _fill_gaps(times)
    return {"characters": letters,
            "character_start_times_seconds": [round(t, DECIMALS) for t in starts],
            "character_end_times_seconds": [round(t, DECIMALS) for t in ends]}


def character_lists(texts: Sequence[str], chunks: Sequence[ChunkTimings], *, leading_space: bool = False) -> dict:
    """:func:`characters` as parallel lists in the style of Cartesia's ``word_timestamps``:
    ``{"characters", "start", "end"}``."""
    shaped = characters(texts, chunks, leading_space=leading_space)
    return {"characters": shaped["characters"], "start": shaped["character_start_times_seconds"],
            "end": shaped["character_end_times_seconds"]}


def _fill_gaps(times: list[tuple[float, float] | None]) -> tuple[list[float], list[float]]:
    """An untimed character spans from the end of the timed one before it to the start of the
    timed one after it (the first timed one's start when none is before it, the last's end
    when none is after it)."""
    known = [t for t in times if t is not None]
    if not known:
        return [0.0] * len(times), [0.0] * len(times)
    starts, ends = [0.0] * len(times), [0.0] * len(times)
    previous_end = known[0][0]
    for i, t in enumerate(times):
        if t is not None:
            starts[i], ends[i] = t
            previous_end = t[1]
        else:
            starts[i] = previous_end
    next_start = known[-1][1]
    for i in range(len(times) - 1, -1, -1):
        if times[i] is not None:
            next_start = times[i][0]
        else:
            ends[i] = max(next_start, starts[i])
    return starts, ends
