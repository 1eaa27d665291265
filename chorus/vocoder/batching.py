"""Which ready items share one pass, and how long a pass will take.

A pass pads every item to the longest one (prompt + tokens), so the flow's cost is
``items x longest``; HiFT's follows the frames it vocodes. Items must also share the solver
settings (steps, CFG weight), which the flow takes once per batch. A pass can also be held to a
time budget, predicted by :class:`PassCostModel` from what earlier passes took.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Literal, Sequence


@dataclass(frozen=True)
class Candidate:
    """One ready item: ``index`` into the caller's list, its flow length in tokens, its solver key,
    and the mel frames HiFT will vocode for it. Candidates are given most urgent first."""

    index: int
    length: int
    key: Hashable
    frames: int = 0


class PassCostModel:
    """Predicts a pass's device time as ``flow_per_token x items x longest + hift_per_frame x
    frames``, with both rates learned from measured passes (exponentially weighted, so the model
    follows the device and the load on it). Until a pass was measured it predicts 0 (no limit)."""

    def __init__(self, smoothing: float = 0.2):
        assert 0 < smoothing <= 1
        self.smoothing = smoothing
        self.flow_per_token: float | None = None
        self.hift_per_frame: float | None = None

    def predict(self, padded_tokens: int, frames: int) -> float:
        return (self.flow_per_token or 0.0) * padded_tokens + (self.hift_per_frame or 0.0) * frames

    def observe(self, padded_tokens: int, frames: int, flow_seconds: float, hift_seconds: float) -> None:
        if padded_tokens > 0 and flow_seconds > 0:
            self.flow_per_token = self._blend(self.flow_per_token, flow_seconds / padded_tokens)
        if frames > 0 and hift_seconds > 0:
            self.hift_per_frame = self._blend(self.hift_per_frame, hift_seconds / frames)

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)


def select_batch(candidates: Sequence[Candidate], max_items: int, max_tokens: int,
                 policy: Literal["fifo", "length"], cost: PassCostModel | None = None,
                 max_seconds: float | None = None) -> list[int]:
    """Indices of the candidates for the next pass; the first (most urgent) candidate is always
    among them.

    ``fifo``: take candidates in order while the budgets hold. ``length``: start from the first
    and repeatedly add the candidate whose length is closest to the batch's current range (a
    length bucket around the first item), while the budgets hold. Budgets: ``max_items``, the
    padded tokens ``items x longest <= max_tokens``, and with ``cost`` and ``max_seconds`` the
    predicted pass time.
    """
    if not candidates:
        return []
    first = candidates[0]
    pool = [c for c in candidates[1:] if c.key == first.key]
    chosen, longest, frames = [first], first.length, first.frames

    def fits(c: Candidate) -> bool:
        size, width = len(chosen) + 1, max(longest, c.length)
        if len(chosen) >= max_items or size * width > max_tokens:
            return False
        return cost is None or max_seconds is None or cost.predict(size * width, frames + c.frames) <= max_seconds

    if policy == "fifo":
        for c in pool:
            if fits(c):
                chosen.append(c)
                longest, frames = max(longest, c.length), frames + c.frames
        return [c.index for c in chosen]
    shortest = first.length
    while pool and len(chosen) < max_items:
        best = min(pool, key=lambda c: max(shortest - c.length, c.length - longest, 0))
        if not fits(best):
            break
        pool.remove(best)
        chosen.append(best)
        shortest, longest = min(shortest, best.length), max(longest, best.length)
        frames += best.frames
    return [c.index for c in chosen]
