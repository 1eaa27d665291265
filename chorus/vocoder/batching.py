"""Which ready items share one pass.

A pass pads every item to the longest one (prompt + tokens), so its cost is
``items x longest``. Items must also share the solver settings (steps, CFG weight), which the
flow takes once per batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Literal, Sequence


@dataclass(frozen=True)
class Candidate:
    """One ready item: ``index`` into the caller's list, its flow length in tokens, its solver key.
    Candidates are given oldest first."""

    index: int
    length: int
    key: Hashable


def select_batch(candidates: Sequence[Candidate], max_items: int, max_tokens: int,
                 policy: Literal["fifo", "length"]) -> list[int]:
    """Indices of the candidates for the next pass; the oldest candidate is always among them.

    ``fifo``: take candidates oldest first while the padded budget holds. ``length``: start from
    the oldest and repeatedly add the candidate whose length is closest to the batch's current
    range (a length bucket around the oldest item), while the budget holds.
    """
    if not candidates:
        return []
    first = candidates[0]
    pool = [c for c in candidates[1:] if c.key == first.key]
    chosen, longest = [first], first.length

    def fits(c: Candidate) -> bool:
        return len(chosen) < max_items and (len(chosen) + 1) * max(longest, c.length) <= max_tokens

    if policy == "fifo":
        for c in pool:
            if fits(c):
                chosen.append(c)
                longest = max(longest, c.length)
        return [c.index for c in chosen]
    shortest = first.length
    while pool and len(chosen) < max_items:
        best = min(pool, key=lambda c: max(shortest - c.length, c.length - longest, 0))
        if not fits(best):
            break
        pool.remove(best)
        chosen.append(best)
        shortest, longest = min(shortest, best.length), max(longest, best.length)
    return [c.index for c in chosen]
