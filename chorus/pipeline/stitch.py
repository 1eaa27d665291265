"""Joining the chunks of one request, the same way on every path.

Each chunk's waveform already starts with S3Gen's 20 ms of silence and 20 ms fade-in, so chunks
are joined end to end; the pipeline streams the same samples in the same order.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def stitch_chunks(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """The request's waveform: its chunks' waveforms, in order."""
    if not pieces:
        return np.zeros(0, np.float32)
    return np.concatenate(pieces).astype(np.float32, copy=False)
