"""The serving process's own pauses on its metrics: the event loop's lag (``chorus.loop_lag``)
and the garbage collector's pauses (``gc_pauses.PauseWatch``), sampled every 50 ms into the
``chorus_event_loop_lag_seconds`` and ``chorus_gc_pause_seconds`` histograms (docs/server.md,
"Where a short answer waits"). One per process: the registry of ``chorus serve`` or an engine
replica of Ray Serve."""
from __future__ import annotations

import asyncio

from chorus.loop_lag import watch_loop_lag
from chorus.gc_pauses import PauseWatch


class ProcessWatch:
    """Samples into ``metrics`` (a ``ProcessMetrics`` or ``ServerMetrics``: its ``loop_lag`` and
    ``gc_pauses`` histograms) from :meth:`start`, on the running loop, until :meth:`stop`."""

    def __init__(self, metrics):
        self.metrics = metrics
        self._pauses = PauseWatch()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        assert self._task is None, "started twice"
        self._pauses.start()
        self._task = asyncio.create_task(watch_loop_lag(self._sampled))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._pauses.stop()

    def _sampled(self, lag_s: float) -> None:
        self.metrics.loop_lag.observe(lag_s)
        self._pauses.drain(lambda generation, seconds: self.metrics.gc_pauses.labels(str(generation)).observe(seconds))
