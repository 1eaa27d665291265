"""The flow-matching velocity estimator (a 1-D U-Net of causal ResNet + transformer blocks).

Input channels are ``[x | mu | speaker (broadcast over time) | cond]`` (4 x 80 = 320). One level
down (no real downsampling), ``mid_levels`` middle levels, one level up with a skip connection,
then a causal conv head to 80 mel bins. Each level is a causal ResNet block conditioned on the
time embedding followed by ``blocks_per_level`` transformer blocks with full (non-causal)
attention over valid frames.

Batch-safe: convs are causal and see only masked inputs, attention masks padded keys and
LayerNorms act per frame, so a valid frame never depends on padding.

Elementwise work between the GEMMs, convolutions and attention goes through
:mod:`chorus.models.s3gen.fused_ops`: a causal block's LayerNorm + Mish + mask (with the term
added after it) and a transformer block's residual add + the LayerNorm that follows it, each one
Triton kernel on CUDA where ``ConditionalDecoder.ops_backend`` says so. The default, ``"torch"``,
runs the plain tensor ops in the order they always ran, so a model outside the vocoder stage is
bitwise what it was; the stage sets ``"auto"`` (``VocoderConfig.flow_ops``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.s3gen.fused_ops import add_layer_norm, norm_mish_mask
from chorus.triton_backend import BACKENDS


@dataclass(frozen=True)
class EstimatorConfig:
    """Shape of the U-Net. Defaults are the released checkpoint's."""

    in_channels: int = 320
    out_channels: int = 80
    channels: int = 256
    heads: int = 8
    head_dim: int = 64
    blocks_per_level: int = 4  # transformer blocks after each ResNet block
    mid_levels: int = 12
    ffn_mult: int = 4
    norm_eps: float = 1e-5

    @property
    def time_embed_dim(self) -> int:
        return 4 * self.channels

    def __post_init__(self) -> None:
        if self.in_channels % 2:
            raise ValueError("in_channels must be even (it is also the sinusoid width)")


def timestep_features(t: torch.Tensor, width: int) -> torch.Tensor:
    """Sinusoidal features of flow times ``t`` ``[B]`` in [0, 1] -> ``[B, width]`` (fp32)."""
    half = width // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    # (1000 * t) first, then * freqs: the product order moves sin's argument (up to ~1000) by ulps.
    angles = (1000 * t)[:, None] * freqs[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, embed_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, embed_dim)
        self.linear_2 = nn.Linear(embed_dim, embed_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(features)))


class CausalConv1d(nn.Conv1d):
    """Stride-1 conv padded on the left only, so frame t sees frames <= t."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size)
        self.left_pad = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left_pad, 0)))


class CausalBlock(nn.Module):
    """Masked causal conv k3 -> LayerNorm over channels -> Mish, masked (keys ``block.0``, ``block.2``).

    Everything after the conv, and a term added after the mask, is :func:`fused_ops.norm_mish_mask
    <chorus.models.s3gen.fused_ops.norm_mish_mask>` with ``ops_backend``."""

    def __init__(self, dim: int, dim_out: int, eps: float):
        super().__init__()
        self.block = nn.ModuleDict({"0": CausalConv1d(dim, dim_out, 3), "2": nn.LayerNorm(dim_out, eps=eps)})
        self.ops_backend = "torch"  # set through ConditionalDecoder.ops_backend

    def forward(self, x: torch.Tensor, mask: torch.Tensor, addend: torch.Tensor | None = None) -> torch.Tensor:
        """``mish(LN(conv(x * mask))) * mask``, plus ``addend`` (broadcast to ``[B, C, T]``) if given."""
        norm = self.block["2"]
        h = self.block["0"](x * mask)
        return norm_mish_mask(h, norm.weight, norm.bias, norm.eps, mask, addend, self.ops_backend)


class CausalResnetBlock(nn.Module):
    """Two causal blocks with the time embedding added in between, plus a 1x1 residual conv.

    Each add is folded into the causal block before it (the time term is read with stride 0 over T)."""

    def __init__(self, dim: int, dim_out: int, time_embed_dim: int, eps: float):
        super().__init__()
        # keys ``mlp.1``: index 0 is the (parameter-free) Mish
        self.mlp = nn.ModuleDict({"1": nn.Linear(time_embed_dim, dim_out)})
        self.block1 = CausalBlock(dim, dim_out, eps)
        self.block2 = CausalBlock(dim_out, dim_out, eps)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time_embed: torch.Tensor) -> torch.Tensor:
        time_term = self.mlp["1"](F.mish(time_embed))[:, :, None]
        h = self.block1(x, mask, addend=time_term)
        return self.block2(h, mask, addend=self.res_conv(x * mask))


class SelfAttention(nn.Module):
    """Multi-head attention without q/k/v biases (keys ``to_q``, ``to_k``, ``to_v``, ``to_out.0``)."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x ``[B, T, C]``, key_mask ``[B, 1, 1, T]`` bool (True = attend)."""
        batch, length, _ = x.shape

        def split(h: torch.Tensor) -> torch.Tensor:
            return h.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(self.to_q(x)), split(self.to_k(x)), split(self.to_v(x)), attn_mask=key_mask
        )
        return self.to_out[0](out.transpose(1, 2).reshape(batch, length, -1))


class GeluProjection(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    """Linear + exact GELU, Linear (keys ``net.0.proj``, ``net.2``; ``net.1`` was dropout)."""

    def __init__(self, dim: int, mult: int):
        super().__init__()
        self.net = nn.ModuleDict({"0": GeluProjection(dim, dim * mult), "2": nn.Linear(dim * mult, dim)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net["2"](self.net["0"](x))


class TransformerBlock(nn.Module):
    """Pre-norm: x += attention(LN1(x)); x += FF(LN3(x)). Works on ``[B, T, C]``.

    Each residual add and the LayerNorm that reads its sum are :func:`fused_ops.add_layer_norm
    <chorus.models.s3gen.fused_ops.add_layer_norm>` with ``ops_backend``: LN3 here, the next
    block's LN1 in :func:`run_transformer_blocks`."""

    def __init__(self, config: EstimatorConfig):
        super().__init__()
        dim = config.channels
        self.norm1 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.attn1 = SelfAttention(dim, config.heads, config.head_dim)
        self.norm3 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.ff = FeedForward(dim, config.ffn_mult)
        self.ops_backend = "torch"  # set through ConditionalDecoder.ops_backend

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The block on its own."""
        x, _ = self.run(x, self.norm1(x), key_mask, next_norm=None)
        return x

    def run(self, x: torch.Tensor, normed: torch.Tensor, key_mask: torch.Tensor,
            next_norm: nn.LayerNorm | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block inside a stack: ``normed`` is ``LN1(x)``, made by the add before it. Returns
        the residual stream after the block and ``next_norm`` of it (None without a next norm)."""
        backend = self.ops_backend
        norm3 = self.norm3
        x, h = add_layer_norm(x, self.attn1(normed, key_mask), norm3.weight, norm3.bias, norm3.eps, backend)
        delta = self.ff(h)
        if next_norm is None:
            return x + delta, None
        return add_layer_norm(x, delta, next_norm.weight, next_norm.bias, next_norm.eps, backend)


def run_transformer_blocks(blocks: Sequence[TransformerBlock], x: torch.Tensor,
                           key_mask: torch.Tensor) -> torch.Tensor:
    """``blocks`` in turn over ``x`` ``[B, T, C]``, each residual add fused with the LayerNorm that
    reads it (the block's LN3, the next block's LN1). With ops backend ``"torch"`` these are the
    ops of calling each block in turn, in the same order, so the same floats."""
    if not blocks:
        return x
    normed = blocks[0].norm1(x)
    last = len(blocks) - 1
    for index, block in enumerate(blocks):
        next_norm = blocks[index + 1].norm1 if index < last else None
        x, normed = block.run(x, normed, key_mask, next_norm)
    return x


def _level(config: EstimatorConfig, dim_in: int, with_conv: bool) -> nn.ModuleList:
    """[resnet, transformer blocks(, causal conv)] as indexed in the checkpoint (``.0``, ``.1.K``, ``.2``)."""
    c = config.channels
    parts: list[nn.Module] = [
        CausalResnetBlock(dim_in, c, config.time_embed_dim, config.norm_eps),
        nn.ModuleList(TransformerBlock(config) for _ in range(config.blocks_per_level)),
    ]
    if with_conv:
        parts.append(CausalConv1d(c, c, 3))
    return nn.ModuleList(parts)


class ConditionalDecoder(nn.Module):
    """Velocity field v(x, t [, r] | mu, speaker, cond) (keys of ``flow.decoder.estimator.*``)."""

    def __init__(self, config: EstimatorConfig, meanflow: bool = False):
        """``meanflow`` adds the end-time (r) embedding and ``time_embed_mixer``."""
        super().__init__()
        self.config = config
        self.meanflow = meanflow
        c = config.channels
        self.time_mlp = TimestepEmbedding(config.in_channels, config.time_embed_dim)
        self.down_blocks = nn.ModuleList([_level(config, config.in_channels, with_conv=True)])
        self.mid_blocks = nn.ModuleList(_level(config, c, with_conv=False) for _ in range(config.mid_levels))
        self.up_blocks = nn.ModuleList([_level(config, 2 * c, with_conv=True)])
        self.final_block = CausalBlock(c, c, config.norm_eps)
        self.final_proj = nn.Conv1d(c, config.out_channels, 1)
        if meanflow:
            self.time_embed_mixer = nn.Linear(2 * config.time_embed_dim, config.time_embed_dim, bias=False)

    @property
    def ops_backend(self) -> str:
        """The kernels of the causal blocks' LayerNorm + Mish + mask (+ add) and the transformer
        blocks' residual add + LayerNorm (:mod:`chorus.models.s3gen.fused_ops`): ``"torch"``
        (default: the plain tensor ops; the vocoder stage sets its own), ``"auto"`` (one
        Triton kernel each on CUDA, the plain ops elsewhere) or ``"triton"``."""
        return self.final_block.ops_backend

    @ops_backend.setter
    def ops_backend(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"flow ops backend must be one of {BACKENDS}, got {backend!r}")
        for module in self.modules():
            if isinstance(module, (CausalBlock, TransformerBlock)):
                module.ops_backend = backend

    def embed_time(self, t: torch.Tensor, r: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Time embedding ``[B, time_embed_dim]``; meanflow mixes the embeddings of t and r."""
        embed = self.time_mlp(timestep_features(t, self.config.in_channels).to(dtype))
        if not self.meanflow:
            assert r is None, "r is only used by meanflow estimators"
            return embed
        assert r is not None, "a meanflow estimator needs r"
        embed_r = self.time_mlp(timestep_features(r, self.config.in_channels).to(dtype))
        return self.time_embed_mixer(torch.cat([embed, embed_r], dim=1))

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        r: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Velocity ``[B, 80, T]``, zero at padded frames.

        x, mu, cond: ``[B, 80, T]``; mask: ``[B, T]`` bool (True = valid); t (and r for
        meanflow): ``[B]`` flow times; spks: ``[B, 80]`` projected speaker embedding.
        """
        dtype = x.dtype
        time_embed = self.embed_time(t, r, dtype)
        length = x.shape[2]
        h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, length), cond], dim=1)
        frame_mask = mask[:, None, :].to(dtype)
        key_mask = mask[:, None, None, :]

        def run_level(level: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
            h = level[0](h, frame_mask, time_embed)
            h = run_transformer_blocks(level[1], h.transpose(1, 2), key_mask)
            return h.transpose(1, 2)

        (down,) = self.down_blocks
        h = run_level(down, h)
        skip = h
        h = down[2](h * frame_mask)
        for level in self.mid_blocks:
            h = run_level(level, h)
        (up,) = self.up_blocks
        h = run_level(up, torch.cat([h, skip], dim=1))
        h = up[2](h * frame_mask)
        h = self.final_block(h, frame_mask)
        return self.final_proj(h * frame_mask) * frame_mask
