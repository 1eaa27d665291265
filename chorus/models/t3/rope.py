"""Rotary position embedding of the Llama backbone, with llama3 frequency rescaling."""
from __future__ import annotations

import math

import torch

from chorus.models.t3.fused_ops import rope_reference
from torch import nn

from chorus.models.variants import Llama3RopeScaling


def llama3_inverse_frequencies(
    head_dim: int, theta: float, scaling: Llama3RopeScaling | None
) -> torch.Tensor:
    """Per-pair rotation frequencies [head_dim // 2] in fp32.

    Base frequencies are theta^(-2i/head_dim). With llama3 scaling, long wavelengths
    (> original_max / low_freq_factor) are divided by ``factor``, short ones
    (< original_max / high_freq_factor) are kept, and the band in between is blended linearly
    in 1/wavelength.
    """
    # fp32 throughout, like the reference, so the table is bit-identical to what it trained with
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is None:
        return inv_freq
    context = scaling.original_max_position_embeddings
    long_wavelength = context / scaling.low_freq_factor
    short_wavelength = context / scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > long_wavelength, inv_freq / scaling.factor, inv_freq)
    blend = (context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * scaled / scaling.factor + blend * scaled
    in_band = ~(wavelength < short_wavelength) & ~(wavelength > long_wavelength)
    return torch.where(in_band, blended, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for given token positions; applied to q and k of shape [N, heads, head_dim]."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float, scaling: Llama3RopeScaling | None):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling
        self.register_buffer("inv_freq", self._frequencies(None), persistent=False)

    def _frequencies(self, device: torch.device | None) -> torch.Tensor:
        return llama3_inverse_frequencies(self.head_dim, self.theta, self.scaling).to(device)

    def materialize(self, device: torch.device | str) -> None:
        """Recompute the (non-checkpoint) frequency table on ``device``; used after building
        the model on the meta device."""
        self.inv_freq = self._frequencies(torch.device(device))

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] long -> (cos, sin), each [N, 1, head_dim] fp32."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        return angles.cos(), angles.sin()

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [N, heads, head_dim]; tables are cast to x's dtype first."""
        return rope_reference(x, cos.to(x.dtype), sin.to(x.dtype))
