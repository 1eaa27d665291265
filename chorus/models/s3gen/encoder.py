"""S3Gen's token encoder: a conformer (without conv modules) that upsamples 25 Hz to 50 Hz.

Layout, for a batch of right-padded sequences of token embeddings ``[B, T, D]``:
embed (Linear + LayerNorm, x sqrt(D)) -> pre-lookahead conv (each frame sees 3 future frames)
-> ``num_layers`` conformer layers -> nearest x2 + causal conv -> embed again ->
``num_up_layers`` conformer layers -> LayerNorm. Attention is full-context with Transformer-XL
relative positions; only padding is masked.

Every operator keeps padded frames from reaching valid ones, so an item in a padded batch gets
the same output as when it runs alone: attention masks padded keys, the pre-lookahead conv sees
zeros past each item's end (as an unpadded item does), and the other convs are causal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.s3gen.fused_ops import rel_position_attention
from chorus.triton_backend import BACKENDS


@dataclass(frozen=True)
class EncoderConfig:
    """Shape of the upsampling conformer. Defaults are the released checkpoint's."""

    width: int = 512
    heads: int = 8
    ffn_width: int = 2048
    num_layers: int = 6
    num_up_layers: int = 4
    lookahead: int = 3  # future frames the pre-lookahead conv sees
    upsample: int = 2  # mel frames per token
    layer_norm_eps: float = 1e-12  # inside conformer layers
    embed_norm_eps: float = 1e-5  # embed / up_embed / after_norm

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")


def sequence_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len]`` bool mask, True at valid positions of right-padded sequences."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def relative_position_table(length: int, width: int, device, dtype) -> torch.Tensor:
    """Sinusoids for relative distances ``length-1, ..., 0, ..., -(length-1)``: ``[1, 2L-1, width]``.

    Computed in fp32 and cast, as the checkpoint was trained with.
    """
    distances = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device)
    inv_freq = torch.exp(
        torch.arange(0, width, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / width)
    )
    angles = distances[:, None] * inv_freq[None, :]
    table = torch.empty(2 * length - 1, width, dtype=torch.float32, device=device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.to(dtype).unsqueeze(0)


class LinearEmbed(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(width) (keys ``out.0``, ``out.1``)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width, eps=eps))
        self.scale = math.sqrt(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.scale


class PreLookahead(nn.Module):
    """Conv over the current and ``lookahead`` future frames, leaky ReLU, causal conv, residual."""

    def __init__(self, width: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(width, width, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Zero the padding so an item's last frames look ahead into zeros, as when it runs alone.
        h = (x * mask[:, :, None]).transpose(1, 2)
        h = F.leaky_relu(self.conv1(F.pad(h, (0, self.lookahead))))
        h = self.conv2(F.pad(h, (2, 0)))
        return h.transpose(1, 2) + x


class RelPositionAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL relative positions (content + position terms).

    ``ops_backend`` (:func:`chorus.models.s3gen.fused_ops.rel_position_attention`): ``"torch"``
    (default: the plain tensor ops, bitwise as before the kernel; the vocoder stage sets its own),
    ``"auto"`` (one Triton kernel on CUDA) or ``"triton"``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.linear_q = nn.Linear(width, width)
        self.linear_k = nn.Linear(width, width)
        self.linear_v = nn.Linear(width, width)
        self.linear_out = nn.Linear(width, width)
        self.linear_pos = nn.Linear(width, width, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.head_dim))
        self.ops_backend = "torch"  # set through UpsampleConformerEncoder.ops_backend

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x ``[B, T, D]``, positions ``[1, 2T-1, D]``, key_mask ``[B, T]`` (True = valid)."""
        batch, length, width = x.shape
        heads, head_dim = self.heads, self.head_dim
        q = self.linear_q(x).view(batch, length, heads, head_dim)
        k = self.linear_k(x).view(batch, length, heads, head_dim).transpose(1, 2)
        v = self.linear_v(x).view(batch, length, heads, head_dim).transpose(1, 2)
        p = self.linear_pos(positions).view(1, -1, heads, head_dim).transpose(1, 2)

        q_content = (q + self.pos_bias_u).transpose(1, 2)
        q_position = (q + self.pos_bias_v).transpose(1, 2)
        out = rel_position_attention(q_content, q_position, k, v, p, key_mask, 1.0 / math.sqrt(head_dim),
                                     self.ops_backend)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(width, hidden)
        self.w_2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-norm layer: x += attention(LN(x)); x += FFN(LN(x))."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.self_attn = RelPositionAttention(config.width, config.heads)
        self.feed_forward = FeedForward(config.width, config.ffn_width)
        self.norm_mha = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.norm_ff = nn.LayerNorm(config.width, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), positions, mask)
        return x + self.feed_forward(self.norm_ff(x))


class CausalUpsample(nn.Module):
    """Nearest-neighbour repeat in time, then a causal conv (left context only)."""

    def __init__(self, width: int, factor: int):
        super().__init__()
        self.factor = factor
        self.conv = nn.Conv1d(width, width, kernel_size=2 * factor + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, T, D]`` -> ``[B, factor*T, D]``."""
        h = x.transpose(1, 2)
        h = h[:, :, :, None].expand(-1, -1, -1, self.factor).flatten(2)  # nearest repeat, no host sync
        h = self.conv(F.pad(h, (2 * self.factor, 0)))
        return h.transpose(1, 2)


class UpsampleConformerEncoder(nn.Module):
    """Token embeddings at 25 Hz -> hidden states at 50 Hz (keys of ``flow.encoder.*``)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.embed = LinearEmbed(config.width, config.embed_norm_eps)
        self.pre_lookahead_layer = PreLookahead(config.width, config.lookahead)
        self.encoders = nn.ModuleList(ConformerLayer(config) for _ in range(config.num_layers))
        self.up_layer = CausalUpsample(config.width, config.upsample)
        self.up_embed = LinearEmbed(config.width, config.embed_norm_eps)
        self.up_encoders = nn.ModuleList(ConformerLayer(config) for _ in range(config.num_up_layers))
        self.after_norm = nn.LayerNorm(config.width, eps=config.embed_norm_eps)

    @property
    def ops_backend(self) -> str:
        """The kernel of every layer's relative-position attention (``RelPositionAttention.ops_backend``):
        ``"torch"`` (default), ``"auto"`` or ``"triton"``."""
        return self.encoders[0].self_attn.ops_backend

    @ops_backend.setter
    def ops_backend(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"encoder attention backend must be one of {BACKENDS}, got {backend!r}")
        for module in self.modules():
            if isinstance(module, RelPositionAttention):
                module.ops_backend = backend

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, D]`` (right-padded), lengths ``[B]`` -> (h ``[B, u*T, D]``, lengths ``[B]``).

        Frames of h past an item's length hold garbage; callers mask them.
        """
        mask = sequence_mask(lengths, x.shape[1])
        x = self.embed(x)
        positions = relative_position_table(x.shape[1], self.config.width, x.device, x.dtype)
        x = self.pre_lookahead_layer(x, mask)
        for layer in self.encoders:
            x = layer(x, positions, mask)

        x = self.up_layer(x)
        lengths = lengths * self.config.upsample
        mask = sequence_mask(lengths, x.shape[1])
        x = self.up_embed(x)
        positions = relative_position_table(x.shape[1], self.config.width, x.device, x.dtype)
        for layer in self.up_encoders:
            x = layer(x, positions, mask)
        return self.after_norm(x), lengths
