"""Start-of-utterance trim and fade applied to every S3Gen waveform.

The first 20 ms are silenced and the next 20 ms fade in along a raised cosine, hiding the
vocoder's start-up transient.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch


def trim_fade_envelope(sample_rate: int = 24000, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gain applied to the first 40 ms (float32, 960 samples at 24 kHz): 20 ms of 0, then 0 -> 1."""
    n_trim = sample_rate // 50
    envelope = torch.zeros(2 * n_trim, device=device)
    envelope[n_trim:] = (torch.cos(torch.linspace(math.pi, 0.0, n_trim, device=device)) + 1) / 2
    return envelope


def apply_trim_fade(wav: torch.Tensor, sample_rate: int = 24000) -> torch.Tensor:
    """Return ``wav`` ((L,) or (B, L), time last) with its start trimmed and faded in; the input is not modified.

    Waveforms shorter than the 40 ms envelope get its first part. Only the start changes, so a
    right-padded batch can be processed whole.
    """
    if wav.dim() not in (1, 2):
        raise ValueError(f"expected a waveform of shape (L,) or (B, L), got {tuple(wav.shape)}")
    envelope = trim_fade_envelope(sample_rate, wav.device).to(wav.dtype)
    head = min(wav.shape[-1], envelope.shape[0])
    out = wav.clone()
    out[..., :head] *= envelope[:head]
    return out


@functools.cache
def _host_envelope(sample_rate: int) -> np.ndarray:
    envelope = trim_fade_envelope(sample_rate).numpy()
    envelope.flags.writeable = False
    return envelope


def apply_trim_fade_at(samples: np.ndarray, start: int, sample_rate: int = 24000) -> None:
    """The host form for audio that arrives in pieces: multiply, in place, samples
    ``[start, start + len(samples))`` of a waveform by its envelope (``apply_trim_fade``'s
    gains, bit for bit; the envelope is made once per sample rate). Samples past the first
    40 ms are left alone."""
    envelope = _host_envelope(sample_rate)
    head = min(samples.shape[0], envelope.shape[0] - start)
    if head > 0:
        samples[:head] *= envelope[start:start + head]
