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

So every capture in the package runs through :func:`capture`, and every device-wide
synchronisation through :func:`synchronize` or :func:`empty_cache`. Captures may overlap one
another, and synchronisations one another, but never a capture and a synchronisation: a
synchronisation waits until no capture is under way or waiting, and a capture waits for the
synchronisations under way to end. Captures go first (a thread that synchronises in a loop
cannot starve one); they are short (milliseconds; the T3 engine lets go between its graphs).
Code outside the package that calls ``torch.cuda.synchronize()`` from another thread while a
model loads can still break a capture; call :func:`synchronize` instead.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

_changed = threading.Condition()
_captures = 0  # captures under way or waiting to start
_synchronisations = 0  # device-wide synchronisations under way
_local = threading.local()  # .capturing: this thread is inside a capture


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, *, stream: torch.cuda.Stream, pool=None) -> Iterator[None]:
    """``torch.cuda.graph`` in ``thread_local`` mode, once no device-wide synchronisation of
    this process is under way; none starts until the capture ends."""
    global _captures
    with _changed:
        _captures += 1
        _changed.wait_for(lambda: _synchronisations == 0)
    _local.capturing = True
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            yield
    finally:
        _local.capturing = False
        with _changed:
            _captures -= 1
            _changed.notify_all()


def _device_wide(operation: Callable[[], None]) -> None:
    global _synchronisations
    if getattr(_local, "capturing", False):
        raise RuntimeError("a device-wide CUDA synchronisation inside a graph capture would invalidate it; "
                           "synchronise before or after the capture")
    with _changed:
        _changed.wait_for(lambda: _captures == 0)
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
