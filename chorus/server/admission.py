"""Admission control: a bounded number of requests in flight, shared by three priorities.

A request holds a :class:`Ticket` from admission until its response ends (or fails). Low
priority may fill only part of the queue, normal a larger part, high all of it, so under
contention there is always room for more urgent work. When the queue is full the answer is 429;
when the KV pool is nearly full and requests are already waiting for it, 503 — both with
``Retry-After`` and before any work is done.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from chorus.engine.request import Priority
from chorus.server.errors import APIError

# the share of the queue each priority may fill
PRIORITY_SHARE = {Priority.HIGH: 1.0, Priority.NORMAL: 0.9, Priority.LOW: 0.6}


@dataclass(frozen=True)
class Ticket:
    priority: Priority


class Admission:
    """Counts requests in flight (one owner of that number; thread-safe)."""

    def __init__(self, max_queue: int, memory_pressure: float, retry_after_s: int):
        self.max_queue = max_queue
        self.memory_pressure = memory_pressure
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._in_flight = {p: 0 for p in Priority}

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(self._in_flight.values())

    def in_flight_by_priority(self) -> dict[Priority, int]:
        with self._lock:
            return dict(self._in_flight)

    def admit(self, priority: Priority, *, queue_limit: int, kv_usage: float, waiting: int) -> Ticket:
        """A ticket, or an ``APIError`` (429 queue full, 503 memory pressure)."""
        headers = {"Retry-After": str(self.retry_after_s)}
        if waiting > 0 and kv_usage >= self.memory_pressure:
            raise APIError(503, f"the server is short of KV-cache memory ({kv_usage:.0%} in use, "
                                f"{waiting} request(s) waiting for it); retry after {self.retry_after_s} s",
                           code="memory_pressure", headers=headers)
        limit = max(1, int(queue_limit * PRIORITY_SHARE[priority]))
        with self._lock:
            total = sum(self._in_flight.values())
            if total >= limit:
                raise APIError(429, f"the server is at capacity ({total} requests in flight; "
                                    f"{priority.name.lower()} priority may use {limit}); retry after "
                                    f"{self.retry_after_s} s", code="queue_full", headers=headers)
            self._in_flight[priority] += 1
        return Ticket(priority)

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            assert self._in_flight[ticket.priority] > 0, ticket
            self._in_flight[ticket.priority] -= 1
