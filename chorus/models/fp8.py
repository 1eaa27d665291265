"""FP8 (E4M3) GEMMs with per-row scales, for the linears of a model that opts in.

A weight ``[N, K]`` is quantised once, per output channel: ``scale[n] = amax(|w[n, :]|) / 448``
(fp32), ``w_fp8 = w / scale`` in E4M3 (448 is E4M3's largest finite value). An activation
``[M, K]`` is quantised per row (per token) when it is used, the same way, with tensor ops only
(no host sync, so it can run inside a CUDA graph). A row or channel of zeros gets a tiny scale
instead of 0, and quantises to zeros.

``fp8_linear`` then computes ``x @ w.T`` from the two quantised operands: on CUDA with compute
capability 8.9 or newer (Ada, Hopper) one ``torch._scaled_mm`` (the E4M3 products summed in fp32,
each sum times ``scale_x[m] * scale_w[n]``, plus the bias, rounded once to bf16); elsewhere its
exact emulation: the E4M3 values widened to fp32 (exact), the same products summed in fp32, the
same scaling and bias, one rounding to the output dtype. The two differ only in the order of the
fp32 sums; the emulation is the reference the GPU path is tested against.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
_MIN_AMAX = 1e-12  # an all-zero row or channel: a tiny scale, so x / scale stays 0 and finite
# what `_scaled_mm` needs of the GEMM: K and N multiples of 16 (mat1 row-major, mat2 column-major)
SCALED_MM_MULTIPLE = 16

# the stages a comma list of ``--fp8`` may name; "flow" is the other stage, not built yet
FP8_STAGES = ("t3",)
_PLANNED_STAGES = ("flow",)


class Fp8Weight(NamedTuple):
    """A weight quantised per output channel: ``weight`` [N, K] E4M3, ``scale`` [N] fp32."""

    weight: torch.Tensor
    scale: torch.Tensor


def parse_fp8_stages(value: str | None) -> tuple[str, ...]:
    """A comma list of stages (``"t3"``; ``""`` or None: none) -> the stages, checked."""
    stages = tuple(s.strip() for s in (value or "").split(",") if s.strip())
    for stage in stages:
        if stage in _PLANNED_STAGES:
            raise ValueError(f"fp8 for the {stage} stage is not implemented yet; the only stage is "
                             f"{', '.join(FP8_STAGES)}")
        if stage not in FP8_STAGES:
            raise ValueError(f"unknown fp8 stage {stage!r}; the only stage is {', '.join(FP8_STAGES)} "
                             f"(a comma list, e.g. --fp8 t3)")
    return tuple(dict.fromkeys(stages))


def _quantize(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = amax.float().clamp_min(_MIN_AMAX) / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def quantize_weight(weight: torch.Tensor) -> Fp8Weight:
    """``weight`` [N, K] (any float dtype) -> E4M3 [N, K] (contiguous) and fp32 scales [N]. On a
    device where ``fp8_linear`` runs ``_scaled_mm``, a shape it cannot take is refused here."""
    assert weight.ndim == 2, f"a weight is [out, in], got shape {tuple(weight.shape)}"
    if scaled_mm_supported(weight.device):
        check_scaled_mm_shape(*weight.shape)
    q, scale = _quantize(weight, weight.abs().amax(dim=1, keepdim=True))
    return Fp8Weight(q.contiguous(), scale.reshape(-1).contiguous())


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] -> E4M3 [M, K] and fp32 scales [M, 1], one per row; no host sync."""
    assert x.ndim == 2, f"activations are [rows, features], got shape {tuple(x.shape)}"
    return _quantize(x, x.abs().amax(dim=1, keepdim=True))


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 values an E4M3 tensor and its per-row scales ([M] or [M, 1]) stand for."""
    return q.float() * scale.reshape(-1, 1)


@functools.cache
def scaled_mm_supported(device: torch.device) -> bool:
    """Whether ``fp8_linear`` runs ``torch._scaled_mm`` on ``device`` (CUDA, capability >= 8.9);
    asked once per device (every projection of an eager step asks)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def check_scaled_mm_shape(out_features: int, in_features: int) -> None:
    """Raise a readable error when a [out, in] weight cannot go through ``torch._scaled_mm``."""
    if out_features % SCALED_MM_MULTIPLE or in_features % SCALED_MM_MULTIPLE:
        raise ValueError(f"an FP8 GEMM on the GPU needs both dimensions of the weight to be multiples of "
                         f"{SCALED_MM_MULTIPLE}; this one is [{out_features}, {in_features}]")


def fp8_linear(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x @ w.T + bias`` for ``x`` [..., K] and a weight from :func:`quantize_weight`, with x
    quantised per row here. ``out_dtype``: None is x's dtype."""
    out_dtype = out_dtype or x.dtype
    flat = x.reshape(-1, x.shape[-1])
    x_fp8, x_scale = quantize_rows(flat)
    if scaled_mm_supported(x.device):
        out = _scaled_mm(x_fp8, x_scale, weight_fp8, weight_scale, bias)
    else:
        out = fp8_linear_reference(x_fp8, x_scale, weight_fp8, weight_scale, bias)
    return out.to(out_dtype).view(*x.shape[:-1], -1)


def fp8_linear_reference(x_fp8: torch.Tensor, x_scale: torch.Tensor, weight_fp8: torch.Tensor,
                         weight_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The exact emulation of ``_scaled_mm``'s row-wise GEMM, in fp32: the E4M3 products summed
    in fp32, times both scales, plus the bias (the caller rounds once to the output dtype)."""
    out = (x_fp8.float() @ weight_fp8.float().t()) * x_scale.reshape(-1, 1) * weight_scale.reshape(1, -1)
    return out if bias is None else out + bias.float()


def _scaled_mm(x_fp8: torch.Tensor, x_scale: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    k = weight_fp8.shape[1]  # the weight's shape was checked when it was quantised
    assert x_fp8.shape[1] == k, f"x has {x_fp8.shape[1]} features, the weight {k}"
    assert x_fp8.is_contiguous() and weight_fp8.is_contiguous(), \
        "_scaled_mm takes mat1 row-major and mat2 column-major (the [N, K] weight transposed)"
    # row-wise scaling: scale_a [M, 1] and scale_b [1, N] in fp32, a bf16 output and a bf16 bias
    return torch._scaled_mm(x_fp8, weight_fp8.t(), scale_a=x_scale.reshape(-1, 1).contiguous(),
                            scale_b=weight_scale.reshape(1, -1), out_dtype=torch.bfloat16,
                            bias=None if bias is None else bias.to(torch.bfloat16))
