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
synchronisation through :func:`synchronize` or :func:`empty_cache`: they hold one process-wide
lock, and a synchronisation waits for a capture under way to end (a capture takes milliseconds;
the T3 engine releases the lock between its graphs). Code outside the package that calls
``torch.cuda.synchronize()`` from another thread while a model loads can still break a capture;
call :func:`synchronize` instead.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_GATE = threading.RLock()


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, *, stream: torch.cuda.Stream, pool=None) -> Iterator[None]:
    """``torch.cuda.graph`` in ``thread_local`` mode, holding the gate: no device-wide
    synchronisation of this process runs while ``graph`` records ``stream``."""
    with _GATE, torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        yield


def synchronize(device: torch.device | int | None = None) -> None:
    """``torch.cuda.synchronize(device)``, after any capture under way has ended."""
    with _GATE:
        torch.cuda.synchronize(device)


def empty_cache() -> None:
    """``torch.cuda.empty_cache()``, after any capture under way has ended."""
    with _GATE:
        torch.cuda.empty_cache()
