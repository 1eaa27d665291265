"""How the pipeline's two stage threads share the machine: on a CPU, a share each of torch's
intra-op threads (``PipelineConfig.split_cpu_threads``); on a GPU, the vocoder thread's own CUDA
stream, so that S3Gen and T3 work overlap on the device."""
from __future__ import annotations

import torch


def thread_shares(device: torch.device, split: bool) -> tuple[int | None, int | None]:
    """Intra-op threads of the T3 thread and of the vocoder thread (None: torch's setting)."""
    if device.type != "cpu" or not split:
        return None, None
    total = torch.get_num_threads()
    return max(1, total - total // 2), max(1, total // 2)


class on_stream:
    """``torch.cuda.stream(s)`` when ``s`` is a CUDA stream, else nothing."""

    def __init__(self, stream):
        self._ctx = torch.cuda.stream(stream) if stream is not None else None

    def __enter__(self):
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
