"""Admission: the one decision, taken before any thread-pool or model work, whether a request
may start. Input: the request's predicted cost and the server's state (``capacity.py``); output:
a :class:`Ticket`, or an ``APIError`` with ``Retry-After``.

In order:

1. **Memory pressure**: the KV pool is nearly full and requests already wait for it: 503
   ``memory_pressure``.
2. **A bounded queue**: at most ``queue_limit`` requests in flight, shared by priorities (low
   may fill 60% of it, normal 90%, high all): 429 ``queue_full``. The hard bound.
3. **Predicted start**: a request whose predicted time to its first audio is beyond its start
   deadline would be admitted only to fail later (a 504 after a long wait), so it is refused
   now: 429 ``overloaded``. Priorities keep their shares here too (low must be predicted to
   start within 60% of the start deadline, normal 90%, high 100%), so urgent work finds room.
   A request that finds nothing in flight is always admitted (the estimates may be stale; it
   has the whole server).
4. **Real time** (``realtime_headroom`` h > 0): the server delivers ``rate`` speech tokens per
   second (``CapacityModel.saturated_rate``: measured while saturated), shared by the requests
   in flight; one more is admitted only while every stream, itself included, would still get
   ``h`` times real time on average:
   ``(streams in flight + 1) * 25 * h / share <= rate`` (the priority's share as above, so high
   priority finds room first): 429 ``overloaded`` otherwise. The start prediction
   alone lets a vocoder-bound server fill up with streams that each crawl below real time (they
   stall, and their first audio comes late enough to miss the deadline); this bound keeps the
   number in flight at what the measured rate serves in time. It applies only while the server
   is saturated (``CapacityModel.saturated``: its busiest stage busy most of the time): below
   that there is capacity to spare by definition, and the rate is only a lower bound of it, so a
   burst on a lightly loaded server is limited by the predicted start alone; and until a rate
   has been measured at saturation (a second of it) the bound waits, since the rate learned
   before the burst describes the lighter load. A device slower than real time (the CPU) leaves
   it off.

**Continuations.** A voice-agent turn (docs/voice-agents.md) is one stream cut into pieces, each
a pipeline request with its own ticket. Its first piece is admitted by the rules above; a later
piece continues the stream (``continues``: the ticket of the piece before it) and is admitted
whatever the load, since refusing it would cut the turn's speech mid-way, and the turn's pieces
count as one stream in the real-time bound (they play one after the other). Their work counts
in the predictions like any other.

**Learning from first audio.** Admission tells the capacity model how its predictions turned
out (:meth:`Admission.started`): each request's first audio (or its start deadline passing)
calibrates the model, and at every decision the request that has waited longest for its first
audio, if it is already past its prediction, raises the calibration to at least that error
(``CapacityModel.observe_waiting``), so a burst turning out slower than predicted tightens
admission before any of it has started. A continuation is left out of both: the vocoder holds
its first audio back while its listener still has audio to hear (docs/vocoder.md,
"Listeners"), so when it starts says nothing of the server's speed.

``Retry-After`` comes from the estimates: for ``overloaded``, how long until enough of the work
in flight has drained for the prediction to fit; for ``queue_full`` and the real-time bound, until
the first request in flight is predicted to finish; never below ``retry_after_s`` nor above ``max_retry_after_s``.
A request holds its ticket from admission until its response ends (or fails).
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from chorus.engine.request import Priority
from chorus.models.speech_tokens import TOKENS_PER_SECOND
from chorus.server.capacity import CapacityModel, Estimate, InFlight, Work
from chorus.server.errors import APIError

# the share of the queue (and of the start deadline) each priority may use
PRIORITY_SHARE = {Priority.HIGH: 1.0, Priority.NORMAL: 0.9, Priority.LOW: 0.6}
POLICIES = ("predicted", "queue")  # "queue": only the bounded queue and memory pressure


@dataclass(eq=False)
class Ticket:
    """One admitted request, from admission to the end of its response."""

    priority: Priority
    work: Work  # predicted tokens and audio delivered
    alone: bool  # nothing else was in flight when it was admitted
    estimate: Estimate  # what was predicted at admission
    chars: int  # characters of its input
    admitted: float  # when (the admission's clock)
    head: "Ticket | None" = field(default=None, repr=False)  # the first ticket of its stream (None: itself)

    @property
    def stream(self) -> "Ticket":
        """The ticket that stands for its stream: a continuation's first piece, else itself."""
        return self.head or self


class Admission:
    """The requests in flight (one owner of that set; thread-safe) and the admission decision."""

    def __init__(self, max_queue: int, memory_pressure: float, retry_after_s: int, *,
                 capacity: CapacityModel, policy: str = "predicted", max_retry_after_s: int = 60,
                 realtime_headroom: float = 0.0, clock=time.perf_counter):
        assert policy in POLICIES, policy
        assert 0 < retry_after_s <= max_retry_after_s
        assert realtime_headroom >= 0, realtime_headroom
        self.realtime_headroom = realtime_headroom  # 0: off (set for the device at start-up)
        self.max_queue = max_queue
        self.memory_pressure = memory_pressure
        self.retry_after_s = retry_after_s
        self.max_retry_after_s = max_retry_after_s
        self.capacity = capacity
        self.policy = policy
        self._lock = threading.Lock()
        self._tickets: set[Ticket] = set()
        self._streams: Counter[Ticket] = Counter()  # tickets in flight per stream (kept with _tickets)
        self._work = InFlight()  # the tickets' work, summarised for the estimates (kept with _tickets)
        # the tickets whose first audio has not come, oldest first (continuations left out)
        self._waiting: dict[Ticket, None] = {}
        self._clock = clock
        self.delivered_tokens = 0.0  # speech tokens of audio delivered, all requests, ever

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._tickets)

    def in_flight_by_priority(self) -> dict[Priority, int]:
        counts = {p: 0 for p in Priority}
        with self._lock:
            for ticket in self._tickets:
                counts[ticket.priority] += 1
        return counts

    def drain_s(self) -> float:
        """Predicted seconds until everything in flight is delivered (inf: no rate measured)."""
        with self._lock:
            if not self._tickets:
                return 0.0
            return self.capacity.estimate(0.0, self._work).drain_s

    def _retry_after(self, seconds: float) -> dict[str, str]:
        value = self.retry_after_s if not math.isfinite(seconds) else \
            min(self.max_retry_after_s, max(self.retry_after_s, math.ceil(seconds - 1e-6)))
        return {"Retry-After": str(value)}

    def admit(self, priority: Priority, *, tokens: float, chars: int, start_deadline_s: float,
              queue_limit: int, kv_usage: float, waiting: int, rows: int = 1,
              continues: Ticket | None = None) -> Ticket:
        """A ticket for a request of ``tokens`` predicted speech tokens holding ``rows`` T3 rows,
        or an ``APIError`` (503 memory pressure, 429 queue full or overloaded). ``continues``: the
        ticket of the request before it in the same stream (a turn's earlier piece, held or
        already released); such a continuation is never refused (see the module's docstring)."""
        if continues is None:
            self._check_memory(kv_usage, waiting)
        with self._lock:
            if continues is None:
                estimate = self._check(priority, tokens, rows, start_deadline_s, queue_limit)
            else:
                estimate = self.capacity.estimate(tokens, self._work, rows)
            ticket = Ticket(priority, Work(tokens, rows), alone=not self._work.count, estimate=estimate, chars=chars,
                            admitted=self._clock(), head=None if continues is None else continues.stream)
            self._tickets.add(ticket)
            if continues is None:
                self._waiting[ticket] = None
            self._streams[ticket.stream] += 1
            self._work.add(ticket.work)
        return ticket

    def certain_refusal(self, priority: Priority, *, start_deadline_s: float, queue_limit: int,
                        kv_usage: float, waiting: int) -> APIError | None:
        """The refusal :meth:`admit` would give *any* request of ``priority`` now, whatever its
        cost (the cheapest request, no tokens and one T3 row, would get it), or None when the
        answer depends on the request. Takes nothing: it lets an overloaded server refuse before
        it reads the request's fields (docs/server.md, "Refusing early")."""
        try:
            self._check_memory(kv_usage, waiting)
            with self._lock:
                self._check(priority, 0.0, 1, start_deadline_s, queue_limit)
        except APIError as refusal:
            # handed on as a value: without its traceback, whose frames (this call's callers, up
            # to the ASGI app holding the returned refusal) would make a reference cycle of
            # each early refusal for the cyclic collector to find
            return refusal.with_traceback(None)
        return None

    def _check_memory(self, kv_usage: float, waiting: int) -> None:
        if waiting > 0 and kv_usage >= self.memory_pressure:
            raise APIError(503, f"the server is short of KV-cache memory ({kv_usage:.0%} in use, "
                                f"{waiting} request(s) waiting for it); retry after {self.retry_after_s} s",
                           code="memory_pressure", headers={"Retry-After": str(self.retry_after_s)})

    def _check(self, priority: Priority, tokens: float, rows: int, start_deadline_s: float,
               queue_limit: int) -> Estimate:
        """The bounded queue, the real-time bound and the predicted start (the lock is held): the
        request's estimate, or the 429 it gets. No rule is easier on a costlier request (the queue
        and the real-time bound ignore the cost; the predicted start grows with the rows), so the
        cheapest request passes whenever any request does."""
        share = PRIORITY_SHARE[priority]
        limit = max(1, int(queue_limit * share))
        name = priority.name.lower()
        work = self._work
        in_flight = work.count
        streams = len(self._streams)  # a turn's pieces in flight are one stream
        oldest = next(iter(self._waiting), None)
        if oldest is not None:
            self.capacity.observe_waiting(oldest.estimate, self._clock() - oldest.admitted)
        estimate = self.capacity.estimate(tokens, work, rows)
        if in_flight >= limit:
            headers = self._retry_after(self._first_done_s(work, estimate.rate))
            raise APIError(429, f"the server is at capacity ({in_flight} requests in flight; {name} "
                                f"priority may use {limit}); retry after {headers['Retry-After']} s",
                           code="queue_full", headers=headers)
        h = self.realtime_headroom / share  # priorities keep their shares: high finds room first
        capacity = self.capacity.saturated_rate  # the rate measured at saturation (None: not yet)
        if self.policy == "predicted" and streams and h > 0 and capacity and self.capacity.saturated \
                and (streams + 1) * TOKENS_PER_SECOND * h > capacity:
            headers = self._retry_after(self._first_done_s(work, capacity))
            raise APIError(429, f"the server is overloaded: its {streams} streams in flight take the audio it "
                                f"can deliver ({capacity / TOKENS_PER_SECOND:.0f} s of audio per second) "
                                f"at {h:g}x real time each; retry after {headers['Retry-After']} s",
                           code="overloaded", headers=headers, rule="realtime")
        budget = share * start_deadline_s
        if self.policy == "predicted" and in_flight and estimate.start_s > budget:
            # the prediction fits once (start_s - budget) seconds' worth of first windows have
            # drained: that many requests finishing, each with the mean remaining work
            mean_remaining = work.remaining / in_flight
            wait = (estimate.start_s - budget) * mean_remaining / self.capacity.first_window_tokens
            headers = self._retry_after(wait)
            raise APIError(429, f"the server is overloaded: a new request would wait about "
                                f"{estimate.start_s:.1f} s for its first audio, beyond the {budget:g} s "
                                f"{name} priority may wait; retry after {headers['Retry-After']} s",
                           code="overloaded", headers=headers, rule="start")
        return estimate

    @staticmethod
    def _first_done_s(work: InFlight, rate: float) -> float:
        """Seconds until the first request in flight is predicted to finish (processor sharing)."""
        return work.min_remaining() * work.count / rate if rate > 0 else math.inf

    def started(self, ticket: Ticket, waited_s: float, *, audio: bool = True) -> None:
        """The ticket's first audio came ``waited_s`` after its request arrived (``audio``
        False: its start deadline passed first, after ``waited_s``): what the capacity model
        learns from it (see the module's docstring)."""
        with self._lock:
            self._waiting.pop(ticket, None)
        if ticket.head is not None:
            return
        self.capacity.observe_start(ticket.estimate, waited_s)
        if audio and ticket.alone:
            self.capacity.observe_solo_start(waited_s)

    def delivered(self, ticket: Ticket, samples: int, sample_rate: int) -> None:
        """``samples`` of the ticket's audio went out."""
        tokens = samples / sample_rate * TOKENS_PER_SECOND
        with self._lock:
            self._work.deliver(ticket.work, tokens)
            self.delivered_tokens += tokens

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            assert ticket in self._tickets, ticket
            self._tickets.discard(ticket)
            self._waiting.pop(ticket, None)
            self._streams[ticket.stream] -= 1
            if not self._streams[ticket.stream]:
                del self._streams[ticket.stream]
            self._work.remove(ticket.work)
