"""chorus.loop_lag: an event loop kept busy shows as the lateness of its timers."""
from __future__ import annotations

import asyncio
import time

from chorus.loop_lag import watch_loop_lag


def test_a_loop_blocked_for_200_ms_reports_a_timer_that_late():
    async def run() -> list[float]:
        lags: list[float] = []
        watch = asyncio.create_task(watch_loop_lag(lags.append, interval_s=0.01))
        await asyncio.sleep(0)  # the watcher is asleep, its timer due 10 ms from now
        time.sleep(0.2)  # the loop runs nothing meanwhile
        while not lags:
            await asyncio.sleep(0.001)
        watch.cancel()
        return lags

    lags = asyncio.run(run())
    assert lags[0] >= 0.19  # due 10 ms after the block began, run after it ended


def test_every_sample_is_a_non_negative_lateness():
    async def run() -> list[float]:
        lags: list[float] = []
        watch = asyncio.create_task(watch_loop_lag(lags.append, interval_s=0.001))
        while len(lags) < 20:
            await asyncio.sleep(0.001)
        watch.cancel()
        return lags

    assert all(lag >= 0.0 for lag in asyncio.run(run()))
