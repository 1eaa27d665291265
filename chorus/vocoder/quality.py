"""Measures of how close streamed audio is to one-pass audio (used by tests and scripts)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from chorus.vocoder.config import VocoderConfig


def one_pass_config(config: VocoderConfig) -> VocoderConfig:
    """``config`` with windows so large that a stream is vocoded in one pass: the reference a
    windowed stream is compared with (same noise layout, same seed)."""
    return replace(config, first_window_tokens=1 << 30, max_window_tokens=1 << 30)


def snr_db(reference: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (inf when equal)."""
    assert reference.shape == test.shape, (reference.shape, test.shape)
    noise = (test.double() - reference.double()).pow(2).sum().item()
    signal = reference.double().pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


@dataclass(frozen=True)
class Jumps:
    """Largest sample-to-sample step near piece boundaries and elsewhere."""

    boundary: float
    interior: float

    @property
    def ratio(self) -> float:
        return self.boundary / self.interior if self.interior else math.inf


def boundary_jumps(wav: torch.Tensor, boundaries: Sequence[int], reach: int) -> Jumps:
    """Steps ``|wav[i] - wav[i - 1]|`` with ``i`` within ``[b, b + reach]`` of a piece boundary
    ``b`` (where a piece starts, covering the cross-faded samples after it) against all others."""
    steps = (wav[1:] - wav[:-1]).abs()  # steps[i - 1] is the step into sample i
    near = torch.zeros_like(steps, dtype=torch.bool)
    for b in boundaries:
        near[max(b - 1, 0):min(b + reach, steps.shape[0])] = True
    boundary = float(steps[near].max()) if bool(near.any()) else 0.0
    interior = float(steps[~near].max()) if bool((~near).any()) else 0.0
    return Jumps(boundary, interior)
