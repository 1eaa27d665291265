"""GPT-2 backbone of Turbo and Nano (LayerNorm, gelu_new MLP, learned absolute positions).

Attribute names follow the checkpoint keys under ``tfmr.``. Projection weights keep the
checkpoint's Conv1D layout [in, out] (transposed relative to ``nn.Linear``), so a state dict
loads without reshuffling. The inner token table ``wte`` is never used and is not kept.

``GPT2Layer.forward`` is the plain definition of a layer; ``GPT2Backbone.forward`` computes the
same sums regrouped so that each residual add runs with the LayerNorm that reads it, and the
MLP's GELU with its up-projection (:mod:`chorus.models.t3.fused_ops`).
"""
from __future__ import annotations

import torch
from torch import nn

from chorus.models.fp8 import Fp8Weight, fp8_linear, quantize_weight
from chorus.models.t3.attention import AttentionCache
from chorus.models.t3.backbone import Shapes
from chorus.models.t3.fused_ops import (
    add_layer_norm, conv1d_gelu_tanh, conv1d_reference, gelu_tanh_reference,
)
from chorus.models.variants import BackboneConfig


class Conv1D(nn.Module):
    """Affine map with the weight stored as [in_features, out_features]."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.fp8: Fp8Weight | None = None  # the weight as [out, in] E4M3 (use_fp8)

    def use_fp8(self, on: bool) -> None:
        """Run this projection as an FP8 GEMM (``chorus.models.fp8``) or not."""
        if not on:
            self.fp8 = None
        elif self.fp8 is None:
            self.fp8 = quantize_weight(self.weight.t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8 is not None:
            return fp8_linear(x, *self.fp8, bias=self.bias)
        flat = x.reshape(-1, x.shape[-1])
        return conv1d_reference(flat, self.weight, self.bias).view(*x.shape[:-1], -1)


class GPT2Attention(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        d = config.hidden_size
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.c_attn = Conv1D(d, 3 * d)  # q | k | v along the output axis
        self.c_proj = Conv1D(d, d)

    def forward(self, x: torch.Tensor, layer: int, cache: AttentionCache) -> torch.Tensor:
        n, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        shape = (n, self.num_heads, self.head_dim)
        out = cache.attend(layer, q.reshape(shape), k.reshape(shape), v.reshape(shape))
        return self.c_proj(out.reshape(n, d))


class GPT2MLP(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        self.c_fc = Conv1D(config.hidden_size, config.intermediate_size)
        self.c_proj = Conv1D(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(gelu_tanh_reference(self.c_fc(x)))


class GPT2Layer(nn.Module):
    def __init__(self, config: BackboneConfig):
        super().__init__()
        d = config.hidden_size
        self.ln_1 = nn.LayerNorm(d, eps=config.norm_eps)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(d, eps=config.norm_eps)
        self.mlp = GPT2MLP(config)

    def forward(self, x: torch.Tensor, layer: int, cache: AttentionCache) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), layer, cache)
        return x + self.mlp(self.ln_2(x))


class GPT2Backbone(nn.Module):
    """Pre-norm GPT-2 decoder stack; see :class:`chorus.models.t3.backbone.Backbone`."""

    # in the official files but never read at inference (T3 feeds embeddings, not ids)
    UNUSED_CHECKPOINT_KEYS = ("wte.weight",)

    def __init__(self, config: BackboneConfig):
        super().__init__()
        assert config.kind == "gpt2"
        self.config = config
        self.wpe = nn.Embedding(config.max_positions, config.hidden_size)
        self.h = nn.ModuleList(GPT2Layer(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        # where the fused steps run: "auto", "triton" or "torch" (chorus.models.t3.fused_ops)
        self.ops_backend = "auto"

    def forward(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: AttentionCache
    ) -> torch.Tensor:
        """The layers' sums, regrouped: ``x, h = add_layer_norm(x, sublayer(h), next_norm)``, where
        the first add is the position embedding (read by layer 0's ``ln_1``) and the last norm is
        ``ln_f``. With ``ops_backend = "torch"`` these are the same ops in the same order as
        ``GPT2Layer.forward`` in turn, so the same floats."""
        backend = self.ops_backend
        first = self.h[0].ln_1
        x, h = add_layer_norm(embeds, self.wpe(positions), first.weight, first.bias, first.eps, backend)
        last = len(self.h) - 1
        for index, layer in enumerate(self.h):
            mlp, ln_2 = layer.mlp, layer.ln_2
            after_mlp = self.h[index + 1].ln_1 if index < last else self.ln_f
            x, h = add_layer_norm(x, layer.attn(h, index, cache), ln_2.weight, ln_2.bias, ln_2.eps, backend)
            if mlp.c_fc.fp8 is None:
                inner = conv1d_gelu_tanh(h, mlp.c_fc.weight, mlp.c_fc.bias, backend)
            else:  # no GELU epilogue for the FP8 GEMM
                inner = gelu_tanh_reference(mlp.c_fc(h))
            x, h = add_layer_norm(x, mlp.c_proj(inner), after_mlp.weight, after_mlp.bias, after_mlp.eps, backend)
        return h

    def use_fp8(self, on: bool) -> None:
        """See :meth:`chorus.models.t3.backbone.Backbone.use_fp8`."""
        for layer in self.h:
            for projection in (layer.attn.c_attn, layer.attn.c_proj, layer.mlp.c_fc, layer.mlp.c_proj):
                projection.use_fp8(on)

    def materialize(self, device: torch.device | str) -> None:
        pass  # every tensor comes from the checkpoint

    @staticmethod
    def checkpoint_shapes(config: BackboneConfig) -> Shapes:
        """Every key of the official files below ``tfmr.`` (unused ones included) -> shape."""
        d, inner = config.hidden_size, config.intermediate_size
        shapes: Shapes = {
            "wte.weight": (config.inner_vocab_size, d),
            "wpe.weight": (config.max_positions, d),
        }
        for i in range(config.num_layers):
            p = f"h.{i}."
            shapes.update({
                p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
                p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                p + "mlp.c_fc.weight": (d, inner), p + "mlp.c_fc.bias": (inner,),
                p + "mlp.c_proj.weight": (inner, d), p + "mlp.c_proj.bias": (d,),
            })
        shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
        return shapes
