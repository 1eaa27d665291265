"""CUDA graph captures and device-wide synchronisations of one process, kept apart.

A process runs GPU work from several threads: the T3 stage and the vocoder stage of a pipeline,
and during a hot swap a model version loading beside the one that serves. Graphs are captured
while the other threads keep working: the T3 engine's at construction, the sampler's and the
vocoder's lazily, on a shape's first uses. Captures run in CUDA's ``thread_local`` mode, so
another thread's launches, stream synchronisations and allocations are allowed meanwhile. A
device-wide operation is not: ``torch.cuda.synchronize()`` and ``torch.cuda.empty_cache()``
(which frees memory, synchronising the device) wait on the capturing stream too, which
invalidates the capture; the capture then fails (a T3 engine would fail to load; a sampler or
vocoder shape would run eagerly from then on).

Nor may two captures overlap: ``torch.cuda.graph`` begins every capture with
``torch.cuda.synchronize()`` and ``torch.cuda.empty_cache()`` of its own, which fail while another
thread's capture is under way and invalidate that capture. (Seen on a server: the vocoder
capturing a graph while it was idle, the T3 thread a sampler graph; both failed, and the failed
capture left its memory pool marked as recording, so every later capture into it failed too.)

So every capture in the package runs through :func:`capture`, and every device-wide
synchronisation through :func:`synchronize` or :func:`empty_cache`. Captures run one at a time,
in the order they asked (a thread that captures graphs back to back cannot starve another's),
and never beside a synchronisation; synchronisations may overlap one another. A synchronisation
waits until no capture is under way or waiting, and a capture waits for its turn and for the
synchronisations under way to end. Captures go first (a thread that synchronises in a loop
cannot starve one); they are short (milliseconds to a few tenths of a second; the T3 engine
lets go between its graphs). A capture that raised may leave its pool marked as recording
and its stream in capture mode, so the next capture goes into a new pool and stream
(:meth:`CaptureTarget.capture` arranges it; graphs captured before keep theirs). Code outside
the package that calls ``torch.cuda.synchronize()`` from another thread while a model loads can
still break a capture; call :func:`synchronize` instead.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

_changed = threading.Condition()
_tickets = 0  # captures ever asked for: each waits for its turn, first come first served
_turn = 0  # the ticket whose capture may run (once no synchronisation is under way); captures
# under way or waiting: _tickets - _turn
_synchronisations = 0  # device-wide synchronisations under way
_local = threading.local()  # .capturing: this thread is inside a capture


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, *, stream: torch.cuda.Stream, pool=None) -> Iterator[None]:
    """``torch.cuda.graph`` in ``thread_local`` mode, once no other capture and no device-wide
    synchronisation of this process is under way; neither starts until the capture ends."""
    global _tickets, _turn
    if getattr(_local, "capturing", False):
        raise RuntimeError("a graph capture inside another would wait for itself; capture one graph at a time")
    with _changed:
        ticket, _tickets = _tickets, _tickets + 1
        # in turn: a thread that captures in a loop would otherwise take the gate again before a
        # woken waiter runs
        _changed.wait_for(lambda: _synchronisations == 0 and _turn == ticket)
    _local.capturing = True
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            yield
    finally:
        _local.capturing = False
        with _changed:
            _turn += 1
            _changed.notify_all()


class CaptureTarget:
    """A memory pool and side stream that graphs are captured into, for one owner (a vocoder
    stage's flow and HiFT graphs, T3's sampler). Capture with :meth:`capture`: a capture that
    raised may leave the pool marked as recording and the stream in capture mode (see the module
    docstring), so the target then takes a new pair for the captures after it; graphs captured
    before keep the old pool."""

    def __init__(self, device: torch.device | int):
        self.device = device
        self._renew()

    @contextmanager
    def capture(self, graph: torch.cuda.CUDAGraph) -> Iterator[None]:
        """:func:`capture` of ``graph`` into this target's pool, on its side stream (which the
        caller makes wait for its inputs). If the capture raises, the exception propagates and
        the next capture uses a new pool and stream."""
        try:
            with capture(graph, pool=self.pool, stream=self.stream):
                yield
        except BaseException:
            self._renew()
            raise

    def _renew(self) -> None:
        with torch.cuda.device(self.device):
            self.pool, self.stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.device)


def _device_wide(operation: Callable[[], None]) -> None:
    global _synchronisations
    if getattr(_local, "capturing", False):
        raise RuntimeError("a device-wide CUDA synchronisation inside a graph capture would invalidate it; "
                           "synchronise before or after the capture")
    with _changed:
        _changed.wait_for(lambda: _turn == _tickets)  # no capture under way or waiting
        _synchronisations += 1
    try:
        operation()
    finally:
        with _changed:
            _synchronisations -= 1
            _changed.notify_all()


def synchronize(device: torch.device | int | None = None) -> None:
    """``torch.cuda.synchronize(device)``, with no capture under way."""
    _device_wide(lambda: torch.cuda.synchronize(device))


def empty_cache() -> None:
    """``torch.cuda.empty_cache()``, with no capture under way."""
    _device_wide(torch.cuda.empty_cache)
