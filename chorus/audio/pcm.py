"""Float samples to integer sample formats: 16-bit PCM and G.711 mu-law.

One rounding for every writer: whole files (chorus.audio.encode) and streams (chorus.audio.streaming).
"""
from __future__ import annotations

import numpy as np


def to_pcm16(wav: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] -> int16, rounded to nearest (scale 32767, so +-1 maps to +-32767).

    Done here rather than by libsndfile, whose WAV and FLAC writers round differently."""
    return np.round(np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)


def to_mulaw(wav: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] -> G.711 mu-law bytes (uint8), through :func:`to_pcm16` and the
    standard segment encoding (bias 132, clip 32635, bits inverted)."""
    pcm = to_pcm16(wav).astype(np.int32)
    sign = np.where(pcm < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(pcm), 32635) + 132
    exponent = np.frexp(magnitude.astype(np.float64))[1] - 8  # floor(log2(magnitude)) - 7, in 0..7
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)
