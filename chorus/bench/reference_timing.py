"""How the reference is timed for a benchmark ratio, shared by ``bench t3`` and ``bench offline``.

Chorus's figures are taken on a warm process (its engines compile their kernels before the timed
pass), so the reference gets the same: one untimed call first (CUDA context, cuBLAS handles, the
allocator's first blocks), then timed calls on chunks spread evenly over the whole workload (not
its first few), enough of them for at least ``min_audio_s`` seconds of audio at the forced
lengths. Every chunk's time is reported, and ``method`` says what was done.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from chorus.models.speech_tokens import TOKENS_PER_SECOND

MIN_TIMED_AUDIO_S = 60.0
DEFAULT_REFERENCE_CHUNKS = 4  # the least timed; more are taken until MIN_TIMED_AUDIO_S


def evenly_spaced(total: int, count: int) -> list[int]:
    """``count`` distinct indices in ``range(total)`` spread evenly, first and last included
    (one: the middle one)."""
    count = max(1, min(count, total))
    if count == 1:
        return [total // 2]
    step = (total - 1) / (count - 1)  # >= 1, so the rounded indices are distinct
    return [int(i * step + 0.5) for i in range(count)]


def select_reference_chunks(lengths: list[int], min_chunks: int, min_audio_s: float = MIN_TIMED_AUDIO_S) -> list[int]:
    """Indices of the chunks to time: evenly spaced, at least ``min_chunks``, and as many more as
    it takes for their forced lengths to reach ``min_audio_s`` of audio (at most every chunk)."""
    if not lengths:
        raise ValueError("the workload has no chunks")
    for count in range(max(1, min(min_chunks, len(lengths))), len(lengths) + 1):
        indices = evenly_spaced(len(lengths), count)
        if sum(lengths[i] for i in indices) / TOKENS_PER_SECOND >= min_audio_s:
            return indices
    return list(range(len(lengths)))


@dataclass
class ReferenceTimes:
    """One untimed warm-up call, then one time per timed chunk."""

    warm_up_index: int
    warm_up_seconds: float  # how long the warm-up took: reported, never counted
    indices: list[int]
    seconds: list[float] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)


def time_reference(call: Callable[[int], Any], indices: list[int], *, warm_up_index: int | None = None,
                   sync: Callable[[], None] = lambda: None,
                   clock: Callable[[], float] = time.perf_counter) -> ReferenceTimes:
    """Run ``call(index)`` once untimed on ``warm_up_index`` (default: the first timed chunk),
    then time it on each of ``indices``; ``sync`` waits for the device before each reading."""
    warm_up_index = indices[0] if warm_up_index is None else warm_up_index
    sync()
    start = clock()
    call(warm_up_index)
    sync()
    times = ReferenceTimes(warm_up_index, clock() - start, list(indices))
    for index in indices:
        sync()
        start = clock()
        result = call(index)
        sync()
        times.seconds.append(clock() - start)
        times.results.append(result)
    return times


def per_chunk(times: ReferenceTimes, chunks: list[str], lengths: list[int]) -> list[dict]:
    return [{"index": i, "chars": len(chunks[i]), "speech_tokens": lengths[i],
             "audio_seconds": round(lengths[i] / TOKENS_PER_SECOND, 2), "seconds": round(s, 4)}
            for i, s in zip(times.indices, times.seconds)]


def method(times: ReferenceTimes, total_chunks: int, lengths: list[int], min_chunks: int, min_audio_s: float,
           extrapolation: str, call: str) -> dict:
    """What the reference figure measured, for the report next to the ratio; ``call`` names the
    reference call that was timed, e.g. ``generate()``."""
    timed_tokens = sum(lengths[i] for i in times.indices)
    return {
        "warm_up": f"one untimed {call} on chunk {times.warm_up_index} first "
                   f"({times.warm_up_seconds:.3f} s, not counted)",
        "chunks_timed": len(times.indices),
        "chunks_in_workload": total_chunks,
        "selection": f"evenly spaced across the workload: at least {min_chunks} chunks, more until the timed "
                     f"audio reaches {min_audio_s:g} s (or every chunk)",
        "timed_audio_seconds": round(timed_tokens / TOKENS_PER_SECOND, 2),
        "workload_audio_seconds": round(sum(lengths) / TOKENS_PER_SECOND, 2),
        "extrapolation": extrapolation,
    }


def check_generated(got: int, wanted: int, index: int) -> None:
    """The reference must have generated the forced length, or its figure is not comparable."""
    if got != wanted:
        raise RuntimeError(f"the reference generated {got} speech tokens for chunk {index}, not the {wanted} it "
                           f"was forced to; its time would not be comparable")
