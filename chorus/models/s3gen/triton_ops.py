"""The Triton kernel of ``fused_ops.snake``: one pass over memory instead of six.

The kernel computes in fp32 and rounds to the activations' dtype after every step where the
plain tensor ops round (``alpha + eps``, its reciprocal, ``x alpha``, the sine, its square, the
quotient, the sum), and is compiled without FP contraction, so in fp32 and bf16 alike it differs
from the reference only where the two sines differ in the last bit of fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _round(value, DTYPE: tl.constexpr):
    """``value`` (fp32) rounded to DTYPE and read back as fp32."""
    return value.to(DTYPE).to(tl.float32)


@triton.jit(do_not_specialize=["length"])
def _snake_kernel(x_ptr, alpha_ptr, mask_ptr, out_ptr, channels, length,
                  HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # item * channels + channel
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < length
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    base = row.to(tl.int64) * length
    x = tl.load(x_ptr + base + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_MASK:  # the mask is 0 or 1: the product is exact
        item = (row // channels).to(tl.int64)
        x = x * tl.load(mask_ptr + item * length + cols, mask=inside, other=0.0).to(tl.float32)
    alpha = tl.load(alpha_ptr + row % channels).to(tl.float32)
    inverse = _round(tl.math.div_rn(1.0, _round(alpha + 1e-9, dtype)), dtype)
    sine = _round(tl.sin(_round(x * alpha, dtype)), dtype)
    y = x + _round(inverse * _round(sine * sine, dtype), dtype)
    tl.store(out_ptr + base + cols, y.to(dtype), mask=inside)


def snake_triton(x: torch.Tensor, alpha: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    assert x.ndim == 3 and alpha.shape == (x.shape[1],), (x.shape, alpha.shape)
    batch, channels, length = x.shape
    x = x.contiguous()
    alpha = alpha.to(x.dtype).contiguous()
    if mask is not None:
        assert mask.shape == (batch, 1, length), (mask.shape, x.shape)
        mask = mask.to(x.dtype).contiguous()
    out = torch.empty_like(x)
    if x.numel():
        grid = (batch * channels, triton.cdiv(length, _BLOCK))
        _snake_kernel[grid](x, alpha, x if mask is None else mask, out, channels, length,
                            HAS_MASK=mask is not None, BLOCK=_BLOCK, num_warps=4, enable_fp_fusion=False)
    return out
