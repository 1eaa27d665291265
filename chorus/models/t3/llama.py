"""Llama backbone of the original and multilingual T3 (RMSNorm, SwiGLU, llama3 RoPE).

Attribute names follow the checkpoint keys under ``tfmr.``; the checkpoint's inner token table
``embed_tokens`` is never used (T3 feeds embeddings) and is not part of this module.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.fp8 import Fp8Weight, fp8_linear, quantize_weight
from chorus.models.t3.attention import AttentionCache
from chorus.models.t3.backbone import Shapes
from chorus.models.t3.fused_ops import add_rms_norm, rms_norm_reference, silu_mul
from chorus.models.t3.rope import RotaryEmbedding
from chorus.models.variants import BackboneConfig

INNER_VOCAB = 8  # rows of the unused ``embed_tokens`` table in the official files


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32 even for bf16 weights, as the reference does
        return rms_norm_reference(x, self.weight, self.eps)


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
        self._qkv: torch.Tensor | None = None
        self._fp8: tuple[Fp8Weight, Fp8Weight] | None = None  # (q|k|v, o) in E4M3 (use_fp8)
        self.ops_backend = "auto"  # chorus.models.t3.fused_ops

    def fuse_projections(self) -> None:
        """Store q, k and v as one [q + 2 kv, d] matrix (one GEMM per step instead of three);
        the three parameters become views of it, so the state dict is unchanged."""
        fused = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        q_out, kv_out = self.q_proj.weight.shape[0], self.k_proj.weight.shape[0]
        self.q_proj.weight = nn.Parameter(fused[:q_out], requires_grad=False)
        self.k_proj.weight = nn.Parameter(fused[q_out:q_out + kv_out], requires_grad=False)
        self.v_proj.weight = nn.Parameter(fused[q_out + kv_out:], requires_grad=False)
        self._qkv = fused

    def use_fp8(self, on: bool) -> None:
        """Run the q|k|v and o projections as FP8 GEMMs (``chorus.models.fp8``) or not."""
        if not on:
            self._fp8 = None
        elif self._fp8 is None:
            qkv = self._qkv if self._qkv is not None else torch.cat(
                [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            self._fp8 = (quantize_weight(qkv), quantize_weight(self.o_proj.weight))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
        cache: AttentionCache,
    ) -> torch.Tensor:
        n = x.shape[0]
        q_shape, kv_shape = (n, self.num_heads, self.head_dim), (n, self.num_kv_heads, self.head_dim)
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self._fp8 is not None:
            q, k, v = fp8_linear(x, *self._fp8[0]).split((q_out, kv_out, kv_out), dim=-1)
        elif self._qkv is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = F.linear(x, self._qkv).split((q_out, kv_out, kv_out), dim=-1)
        out = cache.attend_rotary(layer, q.view(q_shape), k.view(kv_shape), v.view(kv_shape), cos, sin,
                                  self.ops_backend).reshape(n, q_out)
        return self.o_proj(out) if self._fp8 is None else fp8_linear(out, *self._fp8[1])


class SwiGLU(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        d, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

        self._gate_up: torch.Tensor | None = None
        self._fp8: tuple[Fp8Weight, Fp8Weight] | None = None  # (gate|up, down) in E4M3 (use_fp8)
        self.ops_backend = "auto"  # chorus.models.t3.fused_ops

    def fuse_projections(self) -> None:
        """Store gate and up as one [2 * inner, d] matrix (one GEMM per step instead of two);
        the two parameters become views of it, so the state dict is unchanged."""
        fused = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        inner = self.gate_proj.weight.shape[0]
        self.gate_proj.weight = nn.Parameter(fused[:inner], requires_grad=False)
        self.up_proj.weight = nn.Parameter(fused[inner:], requires_grad=False)
        self._gate_up = fused

    def use_fp8(self, on: bool) -> None:
        """Run the gate|up and down projections as FP8 GEMMs (``chorus.models.fp8``) or not."""
        if not on:
            self._fp8 = None
        elif self._fp8 is None:
            gate_up = self._gate_up if self._gate_up is not None else torch.cat(
                [self.gate_proj.weight, self.up_proj.weight])
            self._fp8 = (quantize_weight(gate_up), quantize_weight(self.down_proj.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fp8 is not None:
            gate_up, down = self._fp8
            return fp8_linear(silu_mul(fp8_linear(x, *gate_up), self.ops_backend), *down)
        if self._gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(silu_mul(F.linear(x, self._gate_up), self.ops_backend))


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
        self.ops_backend = "auto"

    def forward(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: AttentionCache
    ) -> torch.Tensor:
        """The layers' sums, regrouped: each residual add is done together with the norm that
        reads its result (``add_rms_norm``), the same values as ``LlamaLayer.forward`` in turn."""
        cos, sin = self.rotary.cos_sin(positions)
        cos, sin = cos.to(embeds.dtype), sin.to(embeds.dtype)  # once per forward, not per layer
        x = embeds
        h = self.layers[0].input_layernorm(x)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            after_attn = layer.post_attention_layernorm
            after_mlp = self.layers[index + 1].input_layernorm if index < last else self.norm
            x, h = add_rms_norm(x, layer.self_attn(h, cos, sin, index, cache), after_attn.weight, after_attn.eps,
                                self.ops_backend)
            x, h = add_rms_norm(x, layer.mlp(h), after_mlp.weight, after_mlp.eps, self.ops_backend)
        return h

    @property
    def ops_backend(self) -> str:
        return self._ops_backend

    @ops_backend.setter
    def ops_backend(self, backend: str) -> None:
        """``auto``, ``triton`` or ``torch``: where the fused elementwise steps run
        (:mod:`chorus.models.t3.fused_ops`)."""
        self._ops_backend = backend
        for layer in self.layers:
            layer.self_attn.ops_backend = layer.mlp.ops_backend = backend

    def use_fp8(self, on: bool) -> None:
        """See :meth:`chorus.models.t3.backbone.Backbone.use_fp8`."""
        for layer in self.layers:
            layer.self_attn.use_fp8(on)
            layer.mlp.use_fp8(on)

    def materialize(self, device: torch.device | str) -> None:
        self.rotary.materialize(device)
        for layer in self.layers:
            layer.self_attn.fuse_projections()
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
