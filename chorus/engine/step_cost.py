"""How long a T3 step will take, learned from the steps the engine has timed.

A step's time is modelled as ``overhead + decode_row_s x decode rows + prefill_token_s x
prefill positions``:

- ``overhead`` and ``decode_row_s`` come from steps that computed only decode rows: an
  exponentially weighted least-squares line through (rows, seconds), both terms kept >= 0. On a
  CPU a small decode step is mostly the fixed cost of reading the weights once, so the intercept
  matters: dividing a one-row step's time by its one row would price every decode row as a whole
  step.
- ``prefill_token_s`` is an exponentially weighted mean over steps with prefill positions of
  ``(seconds - predicted decode part) / positions``; the decode part's share is capped so a
  decode model that overestimates can never make prefill look free.

The scheduler asks ``prefill_budget(target_s, decode_rows)``: how many prefill positions fit in
``target_s`` next to the decode rows. Until a step with prefill positions has been timed it
returns None and the scheduler uses a small safe default.
"""
from __future__ import annotations

import math

# A prefill's measured time is at least this share of its step, whatever the decode model says.
MIN_PREFILL_SHARE = 0.25


class StepCostModel:
    """See the module docstring. ``smoothing``: weight of the newest observation (0, 1]."""

    def __init__(self, smoothing: float = 0.2):
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.smoothing = smoothing
        self.prefill_token_s: float | None = None
        self.overhead_s: float | None = None
        self.decode_row_s: float | None = None
        # exponentially weighted sums over decode-only steps: weight, rows, rows^2, s, rows x s
        self._w = self._x = self._xx = self._y = self._xy = 0.0
        self.observations = 0

    # -- predictions ---------------------------------------------------------------------------
    def decode_seconds(self, decode_rows: int) -> float:
        """Predicted seconds of ``decode_rows`` decode rows alone (0 before any decode step)."""
        if self.overhead_s is None or decode_rows <= 0:
            return 0.0
        return self.overhead_s + self.decode_row_s * decode_rows

    def predict(self, decode_rows: int, prefill_tokens: int) -> float | None:
        """Predicted seconds of a step; None while the prefill rate is unknown and the step has
        prefill positions."""
        if prefill_tokens <= 0:
            return self.decode_seconds(decode_rows)
        if self.prefill_token_s is None:
            return None
        return self.decode_seconds(decode_rows) + self.prefill_token_s * prefill_tokens

    def prefill_budget(self, target_s: float, decode_rows: int) -> int | None:
        """Prefill positions a step with ``decode_rows`` decode rows may add and stay predicted
        within ``target_s`` (0 when the decode rows alone reach it); None while unknown."""
        if self.prefill_token_s is None:
            return None
        if math.isinf(target_s):
            return None if self.prefill_token_s == 0 else 1 << 62
        left = target_s - self.decode_seconds(decode_rows)
        if left <= 0:
            return 0
        if self.prefill_token_s <= 0:
            return 1 << 62
        return int(left / self.prefill_token_s)

    # -- learning ------------------------------------------------------------------------------
    def observe(self, decode_rows: int, prefill_tokens: int, seconds: float) -> None:
        """Record one timed step (``decode_rows`` one-position rows, ``prefill_tokens`` positions
        of the other rows, ``seconds`` from its launch until its tokens were read)."""
        if seconds <= 0 or not math.isfinite(seconds) or decode_rows + prefill_tokens <= 0:
            return
        self.observations += 1
        if prefill_tokens <= 0:
            self._observe_decode(decode_rows, seconds)
            return
        decode = min(self.decode_seconds(decode_rows), (1 - MIN_PREFILL_SHARE) * seconds)
        rate = (seconds - decode) / prefill_tokens
        old = self.prefill_token_s
        self.prefill_token_s = rate if old is None else old + self.smoothing * (rate - old)

    def _observe_decode(self, rows: int, seconds: float) -> None:
        keep = 1 - self.smoothing
        self._w = keep * self._w + 1
        self._x = keep * self._x + rows
        self._xx = keep * self._xx + rows * rows
        self._y = keep * self._y + seconds
        self._xy = keep * self._xy + rows * seconds
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        slope = (self._xy / self._w - mean_x * mean_y) / var if var > 1e-9 * max(1.0, mean_x * mean_x) else 0.0
        slope = max(slope, 0.0)
        intercept = mean_y - slope * mean_x
        if intercept < 0:  # a line through the origin instead
            intercept, slope = 0.0, self._xy / self._xx
        self.overhead_s, self.decode_row_s = intercept, slope
