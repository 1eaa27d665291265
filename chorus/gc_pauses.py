"""The cyclic garbage collector's pauses: measured, and kept short by freezing the start-up heap.

A collection of the oldest generation traverses every tracked object of the process and holds
the GIL meanwhile, so it stops the event loop (requests wait, refusals too) and the T3 and
vocoder threads (the GPU idles) alike. After start-up the heap is mostly what never dies:
modules, models, captured graphs, the web framework (about 350 thousand objects with the tiny
test models; a full collection of them took 123 ms on a 2-core CPU). :func:`freeze` moves
everything alive into the permanent generation, which collections skip, so they traverse only
what requests created. A frozen object that becomes garbage is still freed by its reference
count; only reference cycles among frozen objects wait until :func:`collect_everything`, which
unfreezes, collects and freezes again (a model version's unload calls it).

:class:`PauseWatch` times every collection by generation (``gc.callbacks``) for the metrics
(``chorus_gc_pause_seconds``).
"""
from __future__ import annotations

import gc
import time
from collections import deque
from typing import Callable


def freeze() -> None:
    """Collect what start-up left as garbage, then move every object alive out of the
    collector's sight (``gc.freeze``)."""
    gc.collect()
    gc.freeze()


def collect_everything() -> None:
    """A full collection that also sees the frozen objects (a model just unloaded may hold
    cycles among them), then the survivors frozen again."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Give the frozen objects back to the collector (a server that stops, so that a process
    that starts another, e.g. a test run, frees the first one's cycles)."""
    gc.unfreeze()


class PauseWatch:
    """Times every collection of the process, whichever thread ran it, from :meth:`start` until
    :meth:`stop`; :meth:`drain` hands the pauses over. The collector's callback only appends to
    a deque (atomic, takes no lock): a metric's lock taken there could be the one the
    interrupted thread holds."""

    def __init__(self, keep: int = 10_000):
        self._pauses: deque[tuple[int, float]] = deque(maxlen=keep)  # (generation, seconds)
        self._started: float | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        # the collector runs one collection at a time, under the GIL: start and stop pair up
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._pauses.append((info["generation"], time.perf_counter() - self._started))
            self._started = None

    def start(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def drain(self, observe: Callable[[int, float], None]) -> None:
        """``observe(generation, seconds)`` for every pause since the last drain."""
        while self._pauses:
            observe(*self._pauses.popleft())
