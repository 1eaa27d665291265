"""What the server can do, learned online from what it measures: the estimates admission decides by.

The model is processor sharing over one token rate. The server delivers audio at ``rate``
speech tokens per second (25 tokens are one second of audio) when its busiest stage (T3 or the
vocoder) is busy all the time: measured as the audio delivered over that stage's busy time, so
the rate already includes how well the current concurrency batches, and a lightly loaded server
(streams paced by their text, a few requests) is not taken for a slow one; requests in flight
share it. The vocoder's load is its busy time, which grows with the streams it serves. T3's is
not: it steps whenever anything is in flight, whatever its batch, so it is "busy" all along
with two streams as with two hundred. Its load is what its steps take of a stream's real-time
pace instead: each step gives every stream one token, so a mean step of ``1 / 25`` s gives each
exactly real time and counts as busy all along, a step of 4 ms as busy a tenth of the time
(:func:`stage_load_s`).
A new request's first audio needs its first vocoder window (``first_window_tokens``); while it
is being made, every request in flight progresses as much (or finishes first), so the
predicted time to the first audio is::

    start_s = solo_start_s + (sum over requests in flight of min(remaining_i, W)) / rate

When the T3 batch is full (``max_rows``: a request takes a row per text chunk, two with CFG),
a new request first waits for rows: under processor sharing, the k-th request in flight to
finish (by remaining work) is done after ``sum_i min(remaining_i, remaining_k) / rate``, and
that wait is added for the first k whose rows make room.
``solo_start_s`` is the first-audio latency of a request alone (planning, the prompt, one
vocoder pass), learned from requests that found the server idle (and the start-up canary);
``remaining_i`` is a request's predicted speech tokens minus the audio it has delivered. A
request's tokens are predicted from its characters (``tokens_per_char``, learned from finished
requests) and capped by its token budget. ``drain_s`` (everything in flight, finished) is the
total remaining work over the rate. The model is then calibrated by its own errors: ``bias`` is
the EWMA of observed over predicted first-audio times of admitted requests (kept within
``BIAS_RANGE``), and ``start_s`` is the prediction times it, so a machine that turns out slower
than measured (other work on it, a batch that scales worse) tightens admission by itself. A
request still waiting for its first audio beyond its prediction is a lower bound of the error,
known before its first audio comes: it raises the bias at once (``observe_waiting``), so a burst
that turns out slower than predicted tightens admission while it is still arriving. Every estimate is an EWMA (``EWMA_ALPHA``); the rate is
sampled over ``RATE_WINDOW_S`` of wall time with requests in flight, so an idle server keeps its
last estimate. A sample extrapolates from the busiest stage's utilization u (its busy seconds
over the wall seconds) as delivered / (seconds x u), u at least ``MIN_UTILIZATION``: a stage
busy 20% of the time could deliver about five times what it did. That is a lower bound while
batching pays (a fuller batch delivers more per busy second), exact at saturation. The
utilization itself is kept too (an EWMA over every observation, idle ones included):
``saturated`` says whether the busiest stage is busy most of the time: the server becomes
saturated when the utilization reaches ``SATURATION[1]`` and stays so until it falls below
``SATURATION[0]`` (a hysteresis: a momentary dip under sustained overload must not open the door
to a flood). Only a sample taken while saturated measures capacity, so those samples also feed a
rate of their own, ``saturated_rate``: a window counts when the server was saturated at every
observation of it. The plain ``rate`` follows the load (lower bounds included) and the start
prediction reads it; the real-time bound reads ``saturated_rate`` only, because on a load step the
server turns saturated (the utilization EWMA, within about a second) while ``rate`` still
remembers the light load before it (on an H200 a server that had served one voice agent refused a
turn of 16 new ones as "20 s of audio per second" while it delivered 92).

docs/server.md ("Admission") explains the policy built on this and why.
"""
from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass

from chorus.models.speech_tokens import TOKENS_PER_SECOND

EWMA_ALPHA = 0.3  # weight of a new observation
RATE_WINDOW_S = 1.0  # seconds with requests in flight per sample of the delivery rate
MIN_UTILIZATION = 0.05  # a sample extrapolates at most 1 / this from the busiest stage's utilization
SATURATION = (0.5, 0.75)  # the busiest stage's utilization (EWMA): saturated from [1] on, until below [0]
BIAS_RANGE = (0.5, 4.0)  # the calibration of predicted start times stays within this


def stage_load_s(seconds: float, *, t3_busy_s: float, t3_steps: int, vocoder_busy_s: float) -> float:
    """The busiest stage's busy seconds over ``seconds`` of wall time, as ``observe_delivery``
    takes them (see the module docstring): the vocoder's busy seconds, or T3's share of a
    stream's real-time pace (25 tokens/s x its mean step's seconds, at most all of ``seconds``)
    over its ``t3_steps`` steps, whichever is larger."""
    t3 = seconds * min(1.0, TOKENS_PER_SECOND * t3_busy_s / t3_steps) if t3_steps > 0 else 0.0
    return max(vocoder_busy_s, t3)


@dataclass(frozen=True)
class Estimate:
    """A request's predicted cost and the server's state when it arrived."""

    tokens: float  # the request's predicted speech tokens
    start_s: float  # seconds until its first audio, if admitted now
    drain_s: float  # seconds until everything in flight (this request included) is delivered
    rate: float  # speech tokens per second the server delivers now (estimate)
    calibration: float  # the bias ``start_s`` was multiplied by

    @property
    def raw_start_s(self) -> float:
        """The prediction before calibration."""
        return self.start_s / self.calibration


@dataclass
class Work:
    """One admitted request as the capacity model sees it (its admission ticket holds it)."""

    tokens: float  # predicted speech tokens
    rows: int = 1  # T3 batch rows it holds (a row per text chunk; two with CFG)
    delivered: float = 0.0  # speech tokens of audio delivered so far

    @property
    def remaining(self) -> float:
        return max(0.0, self.tokens - self.delivered)


class InFlight:
    """The requests in flight as the estimates see them: their remaining work kept sorted as it
    changes (a request admitted or released, audio delivered: a bisection and a move in C), so
    an estimate is a few bisections and C sums, not a pass in Python over every request in
    flight (an overloaded server refuses hundreds of requests a second, each estimated).
    Not thread-safe: its owner (``Admission``) locks; every change to a request's ``Work`` goes
    through :meth:`deliver`."""

    def __init__(self, works=()):
        self._remaining: list[float] = []  # ascending
        self._ids: list[int] = []  # the Work of each entry (its id), in the same order
        self._rows: list[int] = []  # and its rows
        self._works: dict[int, Work] = {}
        self.rows = 0  # T3 rows held, all requests
        for work in works:
            self.add(work)

    @property
    def count(self) -> int:
        return len(self._remaining)

    @property
    def remaining(self) -> float:
        """Speech tokens still to deliver, all requests."""
        return sum(self._remaining)

    def add(self, work: Work) -> None:
        i = bisect.bisect_right(self._remaining, work.remaining)
        self._remaining.insert(i, work.remaining)
        self._ids.insert(i, id(work))
        self._rows.insert(i, work.rows)
        self._works[id(work)] = work
        self.rows += work.rows

    def remove(self, work: Work) -> None:
        if self._works.pop(id(work), None) is None:
            return
        value = work.remaining
        lo, hi = bisect.bisect_left(self._remaining, value), bisect.bisect_right(self._remaining, value)
        i = self._ids.index(id(work), lo, hi)
        del self._remaining[i], self._ids[i], self._rows[i]
        self.rows -= work.rows

    def deliver(self, work: Work, tokens: float) -> None:
        """``tokens`` of ``work``'s audio went out (a request no longer in flight only counts them)."""
        member = id(work) in self._works
        if member:
            self.remove(work)
        work.delivered += tokens
        if member:
            self.add(work)

    def min_remaining(self) -> float:
        return self._remaining[0] if self._remaining else 0.0

    def ahead(self, window: float) -> float:
        """Sum over requests of min(remaining, window): the first windows a new request waits for."""
        i = bisect.bisect_left(self._remaining, window)
        return sum(self._remaining[:i]) + window * (len(self._remaining) - i)

    def row_wait(self, rows: int, max_rows: int | None) -> float:
        """Tokens delivered (by everyone) before ``rows`` rows of a ``max_rows`` batch (None:
        unbounded) are free, under processor sharing: the k-th request to finish is done after
        sum_i min(remaining_i, remaining_k), for the first k that frees enough rows."""
        if max_rows is None:
            return 0.0
        needed = min(rows, max_rows)
        free = max_rows - self.rows
        if free >= needed:
            return 0.0
        remaining, n = self._remaining, len(self._remaining)
        for k, held in enumerate(self._rows):
            free += held
            if free >= needed:  # sorted: the k+1 shortest count whole, the rest min(r_i, r_k) = r_k
                return sum(remaining[:k + 1]) + remaining[k] * (n - k - 1)
        return sum(remaining)


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * new


class _RateWindow:
    """Delivery over at least ``RATE_WINDOW_S`` of busy wall time: one rate sample per window."""

    def __init__(self):
        self.seconds = self.busy_s = self.tokens = 0.0  # busy_s: seconds times the busiest stage's utilization

    def add(self, seconds: float, utilization: float, tokens: float) -> float | None:
        """Count an observation; the window's sample (tokens per busy second) once it is full, else None."""
        self.seconds += seconds
        self.busy_s += seconds * utilization
        self.tokens += tokens
        if self.seconds < RATE_WINDOW_S:
            return None
        sample = self.tokens / self.busy_s
        self.reset()
        return sample

    def reset(self) -> None:
        self.seconds = self.busy_s = self.tokens = 0.0


class CapacityModel:
    """The learned estimates (thread-safe). ``prior_tokens_per_char`` and ``prior_rate`` hold
    until the first observations; ``first_window_tokens`` is the vocoder's first window."""

    def __init__(self, *, prior_tokens_per_char: float, prior_rate: float | None = None,
                 first_window_tokens: int = 20, max_rows: int | None = None):
        assert prior_tokens_per_char > 0 and first_window_tokens > 0
        self.max_rows = max_rows  # rows of the T3 batch (None: unbounded)
        self.tokens_per_char = prior_tokens_per_char
        self.rate: float | None = prior_rate  # None: not measured yet
        self.saturated_rate: float | None = prior_rate  # measured while saturated (a prior counts as such)
        self.solo_start_s: float | None = None
        self.bias = 1.0  # observed / predicted first-audio time (EWMA)
        self.utilization: float | None = None  # the busiest stage's busy fraction (EWMA); None: unknown
        self._saturated = True  # until a utilization is measured, assume the worst
        self.first_window_tokens = first_window_tokens
        self._lock = threading.Lock()
        self._window = _RateWindow()  # samples of ``rate``
        self._saturated_window = _RateWindow()  # samples of ``saturated_rate``: saturated all along

    # -- predictions ------------------------------------------------------------------------------
    def predict_tokens(self, chars: int, *, chunks: int, max_new_tokens: int | None) -> float:
        """Speech tokens of a text of ``chars`` characters in ``chunks`` chunks, at most
        ``max_new_tokens`` per chunk (None: no cap)."""
        tokens = max(1.0, chars * self.tokens_per_char)
        return tokens if max_new_tokens is None else min(tokens, float(max_new_tokens * max(1, chunks)))

    def estimate(self, tokens: float, in_flight: "InFlight | list[Work]", rows: int = 1) -> Estimate:
        """The prediction for a request of ``tokens`` holding ``rows`` T3 rows, arriving while
        ``in_flight`` runs (an :class:`InFlight`: no pass over the requests; or a list of them)."""
        if not isinstance(in_flight, InFlight):
            in_flight = InFlight(in_flight)
        with self._lock:
            rate, solo, bias = self.rate, self.solo_start_s or 0.0, self.bias
        if rate is None or rate <= 0:  # nothing measured yet: only the solo latency is known
            return Estimate(tokens, solo * bias, math.inf if in_flight.count else solo, 0.0, bias)
        ahead = in_flight.ahead(self.first_window_tokens)
        total = in_flight.remaining + tokens
        row_wait = in_flight.row_wait(rows, self.max_rows)
        return Estimate(tokens, (solo + (row_wait + ahead) / rate) * bias, total / rate, rate, bias)

    # -- observations -----------------------------------------------------------------------------
    def observe_delivery(self, seconds: float, tokens: float, busy: bool, stage_busy_s: float | None = None) -> None:
        """``tokens`` of audio were delivered over ``seconds``; ``busy``: requests were in flight
        all along (idle time says nothing about capacity and is skipped). ``stage_busy_s``: the
        busiest stage's busy seconds in that time (None: busy all along)."""
        if seconds <= 0:
            return
        if stage_busy_s is not None:
            with self._lock:
                self.utilization = _ewma(self.utilization, min(1.0, stage_busy_s / seconds))
                low, high = SATURATION
                self._saturated = self.utilization >= high or (self._saturated and self.utilization >= low)
        if not busy:
            with self._lock:
                self._saturated_window.reset()
            return
        utilization = 1.0 if stage_busy_s is None else min(1.0, max(MIN_UTILIZATION, stage_busy_s / seconds))
        with self._lock:
            sample = self._window.add(seconds, utilization, tokens)
            if sample is not None:
                self.rate = _ewma(self.rate, sample)
            if stage_busy_s is not None and not self._saturated:
                self._saturated_window.reset()
                return
            sample = self._saturated_window.add(seconds, utilization, tokens)
            if sample is not None:
                self.saturated_rate = _ewma(self.saturated_rate, sample)

    @property
    def saturated(self) -> bool:
        """The busiest stage is busy most of the time (see ``SATURATION``), or that was never measured."""
        return self._saturated

    def observe_cost(self, chars: int, tokens: int, capped: bool) -> None:
        """A finished request: ``tokens`` speech tokens for ``chars`` characters. A request cut
        by its token cap says only that the ratio is at least this, so it raises the estimate
        but never lowers it."""
        if chars <= 0 or tokens <= 0:
            return
        ratio = tokens / chars
        with self._lock:
            if not capped or ratio > self.tokens_per_char:
                self.tokens_per_char = _ewma(self.tokens_per_char, ratio)

    def observe_solo_start(self, seconds: float) -> None:
        """The first-audio latency of a request that had the server to itself."""
        with self._lock:
            self.solo_start_s = _ewma(self.solo_start_s, seconds)

    def observe_start(self, estimate: Estimate, observed_s: float) -> None:
        """An admitted request's first audio came after ``observed_s``; ``estimate`` was its
        prediction at admission."""
        raw = estimate.raw_start_s
        if raw <= 0 or observed_s <= 0:
            return
        with self._lock:
            self.bias = min(BIAS_RANGE[1], max(BIAS_RANGE[0], _ewma(self.bias, observed_s / raw)))

    def observe_waiting(self, estimate: Estimate, waited_s: float) -> None:
        """An admitted request has waited ``waited_s`` and its first audio has not come yet: the
        prediction (``estimate``) was at least that wrong, so the bias is raised to that at once
        (it is never lowered here: only a first audio that came says by how much to lower it)."""
        raw = estimate.raw_start_s
        if raw <= 0 or waited_s <= raw:
            return
        with self._lock:
            self.bias = min(BIAS_RANGE[1], max(self.bias, waited_s / raw))

    def observe_solo_run(self, tokens: int, seconds: float) -> None:
        """A request alone delivered ``tokens`` in ``seconds``: a first rate (one stream's)
        when none was measured under load yet."""
        if tokens > 0 and seconds > 0:
            with self._lock:
                if self.rate is None:
                    self.rate = tokens / seconds
