"""How late an asyncio event loop runs what is due: the wait of everything ready on it.

A server's event loop parses every request and answers every refusal; a load-test client's
loop sends the requests and reads the answers. Either one, when busy (or starved of the GIL by
other threads), delays all of that by the same amount, and a latency measured across the two
cannot say which side added it. :func:`watch_loop_lag` makes the delay observable: it sleeps
``interval_s`` again and again and reports how much later than due each wake-up came.
"""
from __future__ import annotations

import asyncio
from typing import Callable

LAG_INTERVAL_S = 0.05  # one sample every 50 ms: 20 wake-ups a second, nothing measurable in cost


async def watch_loop_lag(observe: Callable[[float], None], interval_s: float = LAG_INTERVAL_S) -> None:
    """Call ``observe(seconds late)`` after every sleep of ``interval_s`` on the running loop,
    until cancelled. A wake-up is late by the time the loop spent on other callbacks (or waiting
    for the GIL) once the timer was due; the loop's clock resolution can make it a hair early,
    which counts as 0."""
    assert interval_s > 0, interval_s
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due))
