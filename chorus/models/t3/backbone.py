"""The interface both T3 backbones (Llama, GPT-2) implement."""
from __future__ import annotations

from typing import Protocol

import torch

from chorus.models.t3.attention import AttentionCache
from chorus.models.variants import BackboneConfig

Shapes = dict[str, tuple[int, ...]]


class Backbone(Protocol):
    """A decoder-only transformer stack over a flat batch of token embeddings."""

    config: BackboneConfig

    def forward(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: AttentionCache
    ) -> torch.Tensor:
        """embeds [N, D] and positions [N] long of the new tokens (any mix of rows, laid out as
        ``cache`` describes) -> hidden states after the final norm [N, D]."""
        ...

    def __call__(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: AttentionCache
    ) -> torch.Tensor: ...

    def use_fp8(self, on: bool) -> None:
        """Run the layers' projections (attention in and out, MLP in and out) as FP8 E4M3 GEMMs
        with per-row scales (``chorus.models.fp8``), or in the model's dtype again. On, each
        weight is quantised once (per output channel) and kept beside the model-dtype weight,
        which stays the parameter: the state dict does not change, and off costs nothing to
        switch back to. Norms, embeddings and the head stay in the model's dtype."""
        ...

    def materialize(self, device: torch.device | str) -> None:
        """Rebuild tensors that are not in the checkpoint after a meta-device construction."""
        ...

