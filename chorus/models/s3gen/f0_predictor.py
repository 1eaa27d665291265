"""HiFT's pitch predictor: a stack of weight-normed 1-D convolutions over the mel, then a linear read-out in Hz."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


WEIGHT_NORM_MARK = "checkpoint_weight_norm"


def checkpoint_conv(conv: nn.Module, weight_norm_layout: bool) -> nn.Module:
    """Mark ``conv`` as weight-normed in the checkpoint; wrap it in torch's weight-norm
    parametrisation when ``weight_norm_layout`` (its state_dict then uses the checkpoint's names).

    Loaders build plain modules (``weight_norm_layout=False``) and fold g * v / ||v|| into the
    marked convs' weights once, which is cheaper than recomputing it on every forward.
    """
    setattr(conv, WEIGHT_NORM_MARK, True)
    return weight_norm(conv) if weight_norm_layout else conv


@dataclass(frozen=True)
class F0PredictorConfig:
    """Shape of the F0 predictor (``mel2wav.f0_predictor.*`` in the checkpoint)."""

    in_channels: int = 80
    hidden_channels: int = 512
    num_layers: int = 5
    kernel_size: int = 3


class F0Predictor(nn.Module):
    """Mel (B, in_channels, T) -> F0 in Hz (B, T), non-negative.

    Submodule names follow the checkpoint: ``condnet.{0,2,4,...}`` are the convolutions (the odd
    indices are the ELU activations between them) and ``classifier`` the read-out. See
    :func:`checkpoint_conv` for ``weight_norm_layout``.
    """

    def __init__(self, config: F0PredictorConfig = F0PredictorConfig(), weight_norm_layout: bool = True):
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        for i in range(config.num_layers):
            conv = nn.Conv1d(config.in_channels if i == 0 else config.hidden_channels, config.hidden_channels,
                             config.kernel_size, padding=config.kernel_size // 2)
            layers += [checkpoint_conv(conv, weight_norm_layout), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(config.hidden_channels, 1)

    def forward(self, mel: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``frame_mask`` (B, 1, T) marks real frames; padded frames never influence real ones and give 0 Hz."""
        x = mel if frame_mask is None else mel * frame_mask
        for layer in self.condnet:
            x = layer(x)
            # Zeroing after each ELU keeps every conv's view of the padding identical to the zero
            # padding an unbatched item would see.
            if frame_mask is not None and isinstance(layer, nn.ELU):
                x = x * frame_mask
        f0 = torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))
        return f0 if frame_mask is None else f0 * frame_mask[:, 0]
