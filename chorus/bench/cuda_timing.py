"""The device-side timing the kernel benches share: CUDA events around a call, the median."""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def median_cuda_ms(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds between CUDA events recorded around ``fn()`` on the current stream,
    over ``reps`` calls, each waited for before the next (warm ``fn`` up first)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
