"""How long a T3 step will take, learned from the steps the engine has timed.

A step's time is modelled as ``overhead + decode_row_s x decode rows + prefill_token_s x
prefill positions``, the three rates fitted together by exponentially weighted least squares
over the timed steps (the newest weighs most, so the fit follows the device and its load), each
kept >= 0. Fitting them together matters: in a burst nearly every step mixes decode rows and
prefill chunks, so a per-position rate taken from such steps alone would charge the decode rows
to the prefill. The intercept matters too: on a CPU a small decode step is mostly the fixed
cost of reading the weights once.

A direction the recent steps do not determine keeps its earlier estimate: the fit is pulled
toward the previous coefficients (ridge regression toward the last solution), the overhead more
than the rates. So while the steps cannot tell them apart (the first steps: one size of prefill
chunk, no decode rows) the time is charged to the rates, which errs on the safe side: a high
per-position rate means small chunks until the data says otherwise. The scheduler asks ``prefill_budget(target_s, decode_rows)``: how many prefill
positions fit in ``target_s`` next to the decode rows, and at most twice the largest prefill
timed so far (the fit is trusted only near what it has seen). Until a step with prefill positions has
been timed it returns None and the scheduler uses a small safe default.
"""
from __future__ import annotations

import math

import numpy as np

# a step's prefill may be at most this many times the largest prefill timed so far: the fit is
# only trusted near what it has seen (a burst's first chunks are all about one size, so they
# cannot tell the overhead from the per-position rate, and a rate too low would be
# extrapolated to a huge chunk: measured, one 741-position step of 8 s against a 1 s target)
MAX_PREFILL_GROWTH = 2.0

# pull toward the previous solution (overhead, per row, per position), in units of one
# observation's weight: the overhead is held firmly, the rates only where nothing determines them
_RIDGE = np.array([0.02, 1e-4, 1e-6])


class StepCostModel:
    """See the module docstring. ``smoothing``: weight of the newest observation (0, 1]."""

    def __init__(self, smoothing: float = 0.1):
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.smoothing = smoothing
        self.overhead_s: float | None = None
        self.decode_row_s: float | None = None
        self.prefill_token_s: float | None = None
        self._xx = np.zeros((3, 3))
        self._xy = np.zeros(3)
        self._coef = np.zeros(3)  # [overhead, per decode row, per prefill position]
        self.observations = 0
        self.largest_prefill = 0  # the most prefill positions of a timed step

    # -- predictions ---------------------------------------------------------------------------
    def decode_seconds(self, decode_rows: int) -> float:
        """Predicted seconds of a step of ``decode_rows`` decode rows alone (0 before any step)."""
        if self.overhead_s is None:
            return 0.0
        return self.overhead_s + self.decode_row_s * max(decode_rows, 0)

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
        left = target_s - self.decode_seconds(decode_rows)
        if left <= 0:
            return 0
        trusted = int(MAX_PREFILL_GROWTH * self.largest_prefill)
        if self.prefill_token_s <= 0:
            return trusted
        return int(min(left / self.prefill_token_s, trusted))

    # -- learning ------------------------------------------------------------------------------
    def observe(self, decode_rows: int, prefill_tokens: int, seconds: float) -> None:
        """Record one timed step (``decode_rows`` one-position rows, ``prefill_tokens`` positions
        of the other rows, ``seconds`` from its launch until its tokens were read)."""
        if seconds <= 0 or not math.isfinite(seconds) or decode_rows + prefill_tokens <= 0:
            return
        x = np.array([1.0, decode_rows, prefill_tokens], dtype=float)
        keep = 1 - self.smoothing
        self._xx = keep * self._xx + np.outer(x, x)
        self._xy = keep * self._xy + x * seconds
        self.observations += 1
        self.largest_prefill = max(self.largest_prefill, prefill_tokens)
        self._coef = self._solve()
        self.overhead_s, self.decode_row_s = float(self._coef[0]), float(self._coef[1])
        if prefill_tokens > 0 or self.prefill_token_s is not None:
            self.prefill_token_s = float(self._coef[2])

    def _solve(self) -> np.ndarray:
        """Least squares with a ridge toward the previous coefficients, all >= 0 (a
        coefficient that comes out negative is fixed at 0 and the rest refitted)."""
        free = [0, 1, 2]
        while True:
            a = self._xx[np.ix_(free, free)] + np.diag(_RIDGE[free])
            b = self._xy[free] + _RIDGE[free] * self._coef[free]
            solution = np.linalg.solve(a, b)
            coef = np.zeros(3)
            coef[free] = solution
            negative = [i for i, c in zip(free, solution) if c < 0]
            if not negative:
                return coef
            free = [i for i in free if i not in negative]
            if not free:
                return coef
