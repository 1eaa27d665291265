"""Triton kernels of ``fused_ops.py``: one launch each, the same roundings as the references.

Every kernel computes in fp32 and rounds to the tensors' dtype exactly where the plain tensor
ops round, so bf16 results match the references bit for bit except for the norm statistics (fp32
sums in another order) and SiLU's ``exp``. One program handles one token row; rows are
independent, so padded rows of a CUDA graph bucket never touch real ones. The add + LayerNorm
kernel also serves the flow estimator's transformer blocks, with frames as rows
(``chorus.models.s3gen.fused_ops.add_layer_norm``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_residual(x_ptr, d_ptr, res_ptr, row, stride_x, stride_d, stride_res, cols, mask):
    """Store row ``x + d`` (added in fp32, rounded to the residual's dtype) and return the
    stored values in fp32: what the norm that follows reads."""
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * stride_d + cols, mask=mask, other=0.0).to(tl.float32)
    residual = (x + d).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row * stride_res + cols, residual, mask=mask)
    return residual.to(tl.float32)


@triton.jit
def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, res_ptr, out_ptr, stride_x, stride_d, stride_res, stride_out,
                         dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    s = _add_residual(x_ptr, d_ptr, res_ptr, row, stride_x, stride_d, stride_res, cols, mask)
    inv = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / dim + eps)
    normed = (s * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    assert x.ndim == 2 and delta.shape == x.shape and weight.shape == (x.shape[1],), (x.shape, delta.shape)
    assert x.stride(1) == 1 and delta.stride(1) == 1 and weight.is_contiguous()
    residual = torch.empty_like(x, memory_format=torch.contiguous_format)
    out = torch.empty_like(residual)
    n, dim = x.shape
    if n:
        _add_rms_norm_kernel[(n,)](x, delta, weight, residual, out, x.stride(0), delta.stride(0),
                                   residual.stride(0), out.stride(0), dim, eps,
                                   BLOCK=triton.next_power_of_2(dim), num_warps=4)
    return residual, out


@triton.jit
def rope_heads(x_heads, cos_row, sin_row, mask, HALF: tl.constexpr):
    """Rotate the heads at ``x_heads`` (pointers to each head's dim 0, a [heads, 1] block; lanes
    under ``mask`` [heads, HALF]) by one token's tables: returns both halves of
    ``x * cos + rotate_half(x) * sin`` in x's dtype, each product and the sum rounded like the
    tensor ops. The one copy of the rotation, for every kernel that rotates: compile those with
    ``enable_fp_fusion=False`` (no multiply-add contracted into an FMA), so that they all round
    alike and as the reference."""
    c = tl.arange(0, HALF)[None, :]
    first = tl.load(x_heads + c, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(x_heads + HALF + c, mask=mask, other=0.0).to(tl.float32)
    cos1 = tl.load(cos_row + c).to(tl.float32)
    cos2 = tl.load(cos_row + HALF + c).to(tl.float32)
    sin1 = tl.load(sin_row + c).to(tl.float32)
    sin2 = tl.load(sin_row + HALF + c).to(tl.float32)
    ty = x_heads.dtype.element_ty
    out1 = ((first * cos1).to(ty).to(tl.float32) + (-second * sin1).to(ty).to(tl.float32)).to(ty)
    out2 = ((second * cos2).to(ty).to(tl.float32) + (first * sin2).to(ty).to(tl.float32)).to(ty)
    return out1, out2


@triton.jit
def _rope_kernel(x_ptr, out_ptr, cos_ptr, sin_ptr, stride_xn, stride_xh, stride_on, stride_oh,
                 stride_cn, stride_sn, heads, HEADS: tl.constexpr, HALF: tl.constexpr):
    row = tl.program_id(0)
    h = tl.arange(0, HEADS)[:, None]
    c = tl.arange(0, HALF)[None, :]
    mask = (h < heads) & (c < HALF)
    out1, out2 = rope_heads(x_ptr + row * stride_xn + h * stride_xh, cos_ptr + row * stride_cn,
                            sin_ptr + row * stride_sn, mask, HALF)
    o_row = out_ptr + row * stride_on + h * stride_oh
    tl.store(o_row + c, out1, mask=mask)
    tl.store(o_row + HALF + c, out2, mask=mask)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    n, heads, head_dim = x.shape
    assert x.stride(2) == 1 and head_dim % 2 == 0 and triton.next_power_of_2(head_dim) == head_dim, x.shape
    out = torch.empty((n, heads, head_dim), dtype=x.dtype, device=x.device)
    if n:
        _rope_kernel[(n,)](x, out, cos, sin, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                           cos.stride(0), sin.stride(0), heads, HEADS=triton.next_power_of_2(heads),
                           HALF=head_dim // 2, num_warps=4, enable_fp_fusion=False)  # see rope_heads
    return out


def adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether k's heads follow q's in one tensor (q and k are views of one projection output),
    so that ``q.as_strided`` over both heads stays inside q's storage. Equal addresses alone are
    not enough: two separate allocations can lie back to back (one token's q and k often do)."""
    head_dim = q.shape[2]
    return (q.stride(0) == k.stride(0) and q.stride(1) == k.stride(1) == head_dim
            and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
            and k.data_ptr() == q.data_ptr() + q.shape[1] * head_dim * q.element_size())


def rope_qk_triton(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = q.shape[2]
    assert cos.shape[-1] == sin.shape[-1] == head_dim and cos.stride(-1) == sin.stride(-1) == 1
    assert cos.dtype == sin.dtype == q.dtype == k.dtype, (cos.dtype, q.dtype)
    if adjacent_heads(q, k):  # one launch over both
        both = q.as_strided((q.shape[0], q.shape[1] + k.shape[1], head_dim), q.stride())
        out = _rope(both, cos, sin)
        return out[:, :q.shape[1]], out[:, q.shape[1]:]
    return _rope(q, cos, sin), _rope(k, cos, sin)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_out, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    cols = start + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gu + inner + cols, mask=mask, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(ty), mask=mask)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    assert gate_up.ndim == 2 and gate_up.shape[1] % 2 == 0 and gate_up.stride(1) == 1, gate_up.shape
    n, inner = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((n, inner), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    if n:
        _silu_mul_kernel[(n, triton.cdiv(inner, block))](gate_up, out, gate_up.stride(0), out.stride(0), inner,
                                                         BLOCK=block, num_warps=4)
    return out


@triton.jit
def _add_layer_norm_kernel(x_ptr, d_ptr, w_ptr, b_ptr, res_ptr, out_ptr, stride_x, stride_d, stride_res, stride_out,
                           dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    s = _add_residual(x_ptr, d_ptr, res_ptr, row, stride_x, stride_d, stride_res, cols, mask)
    mean = tl.sum(s, axis=0) / dim
    centred = tl.where(mask, s - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / dim + eps)  # biased variance, as LayerNorm
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (centred * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)


def add_layer_norm_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n, dim = x.shape
    assert x.ndim == 2 and delta.shape == x.shape and weight.shape == bias.shape == (dim,), (x.shape, delta.shape)
    assert x.stride(1) == 1 and delta.stride(1) == 1 and weight.is_contiguous() and bias.is_contiguous()
    residual = torch.empty_like(x, memory_format=torch.contiguous_format)
    out = torch.empty_like(residual)
    if n:
        _add_layer_norm_kernel[(n,)](x, delta, weight, bias, residual, out, x.stride(0), delta.stride(0),
                                     residual.stride(0), out.stride(0), dim, eps,
                                     BLOCK=triton.next_power_of_2(dim), num_warps=4)
    return residual, out
