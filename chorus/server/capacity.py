"""What the server can do, learned online from what it measures: the estimates admission decides by.

The model is processor sharing over one token rate. The server delivers audio at ``rate``
speech tokens per second (25 tokens are one second of audio), measured while it is busy, so the
rate already includes how well the current concurrency batches; requests in flight share it.
A new request's first audio needs its first vocoder window (``first_window_tokens``); while it
is being made, every request in flight progresses as much (or finishes first), so the
predicted time to the first audio is::

    start_s = solo_start_s + (sum over requests in flight of min(remaining_i, W)) / rate

``solo_start_s`` is the first-audio latency of a request alone (planning, the prompt, one
vocoder pass), learned from requests that found the server idle (and the start-up canary);
``remaining_i`` is a request's predicted speech tokens minus the audio it has delivered. A
request's tokens are predicted from its characters (``tokens_per_char``, learned from finished
requests) and capped by its token budget. ``drain_s`` (everything in flight, finished) is the
total remaining work over the rate. Every estimate is an EWMA (``EWMA_ALPHA``); the rate is
sampled over ``RATE_WINDOW_S`` of busy time, so an idle server keeps its last estimate.

docs/server.md ("Admission") explains the policy built on this and why.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

TOKENS_PER_SECOND = 25  # speech tokens per second of audio (every Chatterbox variant)
EWMA_ALPHA = 0.3  # weight of a new observation
RATE_WINDOW_S = 1.0  # busy seconds per sample of the delivery rate


@dataclass(frozen=True)
class Estimate:
    """A request's predicted cost and the server's state when it arrived."""

    tokens: float  # the request's predicted speech tokens
    start_s: float  # seconds until its first audio, if admitted now
    drain_s: float  # seconds until everything in flight (this request included) is delivered
    rate: float  # speech tokens per second the server delivers now (estimate)


@dataclass
class Work:
    """One admitted request as the capacity model sees it (its admission ticket holds it)."""

    tokens: float  # predicted speech tokens
    delivered: float = 0.0  # speech tokens of audio delivered so far

    @property
    def remaining(self) -> float:
        return max(0.0, self.tokens - self.delivered)


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * new


class CapacityModel:
    """The learned estimates (thread-safe). ``prior_tokens_per_char`` and ``prior_rate`` hold
    until the first observations; ``first_window_tokens`` is the vocoder's first window."""

    def __init__(self, *, prior_tokens_per_char: float, prior_rate: float | None = None,
                 first_window_tokens: int = 20):
        assert prior_tokens_per_char > 0 and first_window_tokens > 0
        self.tokens_per_char = prior_tokens_per_char
        self.rate: float | None = prior_rate  # None: not measured yet
        self.solo_start_s: float | None = None
        self.first_window_tokens = first_window_tokens
        self._lock = threading.Lock()
        self._window_s = 0.0
        self._window_tokens = 0.0

    # -- predictions ------------------------------------------------------------------------------
    def predict_tokens(self, chars: int, *, chunks: int, max_new_tokens: int | None) -> float:
        """Speech tokens of a text of ``chars`` characters in ``chunks`` chunks, at most
        ``max_new_tokens`` per chunk (None: no cap)."""
        tokens = max(1.0, chars * self.tokens_per_char)
        return tokens if max_new_tokens is None else min(tokens, float(max_new_tokens * max(1, chunks)))

    def estimate(self, tokens: float, in_flight: list[Work]) -> Estimate:
        """The prediction for a request of ``tokens`` arriving while ``in_flight`` runs."""
        with self._lock:
            rate, solo = self.rate, self.solo_start_s or 0.0
        w = self.first_window_tokens
        if rate is None or rate <= 0:  # nothing measured yet: only the solo latency is known
            return Estimate(tokens, solo, math.inf if in_flight else solo, 0.0)
        ahead = sum(min(work.remaining, w) for work in in_flight)
        total = sum(work.remaining for work in in_flight) + tokens
        return Estimate(tokens, solo + ahead / rate, total / rate, rate)

    # -- observations -----------------------------------------------------------------------------
    def observe_delivery(self, seconds: float, tokens: float, busy: bool) -> None:
        """``tokens`` of audio were delivered over ``seconds``; ``busy``: requests were in flight
        all along (idle time says nothing about capacity and is skipped)."""
        if not busy or seconds <= 0:
            return
        with self._lock:
            self._window_s += seconds
            self._window_tokens += tokens
            if self._window_s >= RATE_WINDOW_S:
                self.rate = _ewma(self.rate, self._window_tokens / self._window_s)
                self._window_s = self._window_tokens = 0.0

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

    def observe_solo_run(self, tokens: int, seconds: float) -> None:
        """A request alone delivered ``tokens`` in ``seconds``: a first rate (one stream's)
        when none was measured under load yet."""
        if tokens > 0 and seconds > 0:
            with self._lock:
                if self.rate is None:
                    self.rate = tokens / seconds
