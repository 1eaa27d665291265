"""Llama backbone of the original and multilingual T3 (RMSNorm, SwiGLU, llama3 RoPE).

Attribute names follow the checkpoint keys under ``tfmr.``; the checkpoint's inner token table
``embed_tokens`` is never used (T3 feeds embeddings) and is not part of this module.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.t3.attention import AttentionCache
from chorus.models.t3.backbone import Shapes
from chorus.models.t3.rope import RotaryEmbedding
from chorus.models.variants import BackboneConfig

INNER_VOCAB = 8  # rows of the unused ``embed_tokens`` table in the official files


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32 even for bf16 weights, as the reference does; the fused op keeps
        # the kernel count of a decode step low
        normed = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        d, heads, head_dim = config.hidden_size, config.num_heads, config.head_dim
        kv = config.num_kv_heads * head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = heads, config.num_kv_heads, head_dim
        self.q_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv, bias=False)
        self.v_proj = nn.Linear(d, kv, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
        cache: AttentionCache,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        q, k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
        out = cache.attend(layer, q, k, v)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        d, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

        self._gate_up: torch.Tensor | None = None

    def fuse_projections(self) -> None:
        """Store gate and up as one [2 * inner, d] matrix (one GEMM per step instead of two);
        the two parameters become views of it, so the state dict is unchanged."""
        fused = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        inner = self.gate_proj.weight.shape[0]
        self.gate_proj.weight = nn.Parameter(fused[:inner], requires_grad=False)
        self.up_proj.weight = nn.Parameter(fused[inner:], requires_grad=False)
        self._gate_up = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self._gate_up).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaLayer(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
        cache: AttentionCache,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    """Pre-norm Llama decoder stack; see :class:`chorus.models.t3.backbone.Backbone`."""

    # in the official files but never read at inference (T3 feeds embeddings, not ids)
    UNUSED_CHECKPOINT_KEYS = ("embed_tokens.weight",)

    def __init__(self, config: BackboneConfig):
        super().__init__()
        assert config.kind == "llama"
        self.config = config
        self.layers = nn.ModuleList(LlamaLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: AttentionCache
    ) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(positions)
        cos, sin = cos.to(embeds.dtype), sin.to(embeds.dtype)  # once per forward, not per layer
        x = embeds
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, index, cache)
        return self.norm(x)

    def materialize(self, device: torch.device | str) -> None:
        self.rotary.materialize(device)
        for layer in self.layers:
            layer.mlp.fuse_projections()

    @staticmethod
    def checkpoint_shapes(config: BackboneConfig) -> Shapes:
        """Every key of the official files below ``tfmr.`` (unused ones included) -> shape."""
        d, inner = config.hidden_size, config.intermediate_size
        q_out = config.num_heads * config.head_dim
        kv_out = config.num_kv_heads * config.head_dim
        shapes: Shapes = {"embed_tokens.weight": (INNER_VOCAB, d)}
        for i in range(config.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "self_attn.q_proj.weight": (q_out, d),
                p + "self_attn.k_proj.weight": (kv_out, d),
                p + "self_attn.v_proj.weight": (kv_out, d),
                p + "self_attn.o_proj.weight": (d, q_out),
                p + "mlp.gate_proj.weight": (inner, d),
                p + "mlp.up_proj.weight": (inner, d),
                p + "mlp.down_proj.weight": (d, inner),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
            })
        shapes["norm.weight"] = (d,)
        return shapes
