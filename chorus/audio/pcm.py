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


_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def to_alaw(wav: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] -> G.711 A-law bytes (uint8), through :func:`to_pcm16`: the
    13-bit magnitude's segment and 4 mantissa bits, even bits inverted (0x55)."""
    pcm = to_pcm16(wav).astype(np.int32) >> 3
    positive = pcm >= 0
    magnitude = np.where(positive, pcm, -pcm - 1)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude)  # the first end >= magnitude: 0..8
    shift = np.where(segment < 2, 1, segment)
    value = np.where(segment >= 8, 0x7F, (np.minimum(segment, 7) << 4) | ((magnitude >> shift) & 0x0F))
    return (value ^ np.where(positive, 0xD5, 0x55)).astype(np.uint8)


def from_mulaw(data: np.ndarray) -> np.ndarray:
    """G.711 mu-law bytes (uint8) -> int16 samples (the inverse of :func:`to_mulaw`'s steps)."""
    value = ~data.astype(np.int32) & 0xFF
    magnitude = (((value & 0x0F) << 3) + 0x84) << ((value & 0x70) >> 4)
    return np.where(value & 0x80, 0x84 - magnitude, magnitude - 0x84).astype(np.int16)


def from_alaw(data: np.ndarray) -> np.ndarray:
    """G.711 A-law bytes (uint8) -> int16 samples (the inverse of :func:`to_alaw`'s steps)."""
    value = data.astype(np.int32) ^ 0x55
    segment = (value & 0x70) >> 4
    base = ((value & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = np.where(segment > 1, base << np.maximum(segment - 1, 0), base)
    return np.where(value & 0x80, magnitude, -magnitude).astype(np.int16)
