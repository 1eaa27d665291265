"""The Triton kernels of ``fused_ops``: one pass over memory each instead of several.

Every kernel computes in fp32 and rounds to the activations' dtype after every step where the
plain tensor ops round, so in fp32 and bf16 alike it differs from its reference only where the
two compute one step's fp32 value differently:

- ``snake``: rounds after ``alpha + eps``, its reciprocal, ``x alpha``, the sine, its square, the
  quotient and the sum, compiled without FP contraction: only Triton's sine and PyTorch's may
  differ, in the last bit of fp32.
- ``norm_mish_mask``: rounds after the LayerNorm (affine included), after Mish and after the
  added term (the mask is 0 or 1: its product is exact). The norm's mean and variance are fp32
  sums in another order than PyTorch's, and Mish is ``x n / (n + 2)`` with ``n = e^x (e^x + 2)``
  (``tanh(softplus(x))`` in closed form), a few fp32 ulps from PyTorch's.
- ``add_layer_norm_frames``: T3's add + LayerNorm kernel
  (:func:`chorus.models.t3.triton_ops.add_layer_norm_triton`, which rounds the sum and the norm's
  output once each), with the frames of ``[B, T, C]`` tensors as its rows: one kernel serves
  GPT-2's layers and the estimator's transformer blocks.

``rel_position_attention`` is the exception: a flash-attention kernel, it keeps the scores, the
softmax and the sums in fp32 where the plain ops round the position scores and the bias to the
activations' dtype, and rounds only the softmax weights (for the P V dot) and the output. In fp32
it differs from its reference by the order of the sums.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.models.t3.triton_ops import add_layer_norm_triton

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


# -------------------------------------------------------------------------------- flow estimator
_FRAMES_PER_PROGRAM = 32  # frames of one item per program (all channels); not tuned on a GPU yet
_MISH_LINEAR_FROM = tl.constexpr(20.0)  # above this, tanh(softplus(x)) is 1.0 in fp32: Mish is x


@triton.jit
def _mish(x):
    """``x tanh(softplus(x))`` in fp32: ``tanh(log(1 + e^x)) = n / (n + 2)`` with
    ``n = e^x (e^x + 2)``, no cancellation for negative x, and 1 where e^x would overflow."""
    e = tl.exp(tl.minimum(x, _MISH_LINEAR_FROM))
    n = e * (e + 2.0)
    return x * tl.where(x > _MISH_LINEAR_FROM, 1.0, tl.math.div_rn(n, n + 2.0))


# the length and the strides that step over items (multiples of T) vary with every pass's shape:
# not specialised on, so one compiled kernel serves them all
@triton.jit(do_not_specialize=["length", "stride_hb", "stride_mb", "stride_ab", "stride_ob"])
def _norm_mish_mask_kernel(h_ptr, w_ptr, b_ptr, mask_ptr, add_ptr, out_ptr, channels, length, eps,
                           stride_hb, stride_hc, stride_ht, stride_mb, stride_mt,
                           stride_ab, stride_ac, stride_at, stride_ob, stride_oc, stride_ot,
                           HAS_ADDEND: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    item = tl.program_id(0).to(tl.int64)
    frames = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    chans = tl.arange(0, BLOCK_C)
    in_frames = frames < length
    inside = (chans < channels)[:, None] & in_frames[None, :]
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    c, t = chans[:, None], frames[None, :]
    h = tl.load(h_ptr + item * stride_hb + c * stride_hc + t * stride_ht, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(h, axis=0) / channels  # per frame: the norm runs over the channel axis
    centred = tl.where(inside, h - mean[None, :], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / channels + eps)  # biased variance, as LayerNorm
    w = tl.load(w_ptr + chans, mask=chans < channels, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + chans, mask=chans < channels, other=0.0).to(tl.float32)
    normed = _round(centred * rstd[None, :] * w[:, None] + b[:, None], dtype)
    keep = tl.load(mask_ptr + item * stride_mb + frames * stride_mt, mask=in_frames, other=0.0).to(tl.float32)
    y = _round(_mish(normed), dtype) * keep[None, :]  # the mask is 0 or 1: the product is exact
    if HAS_ADDEND:
        y += tl.load(add_ptr + item * stride_ab + c * stride_ac + t * stride_at, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + item * stride_ob + c * stride_oc + t * stride_ot, y.to(dtype), mask=inside)


def norm_mish_mask_triton(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                          mask: torch.Tensor, addend: torch.Tensor | None) -> torch.Tensor:
    """``fused_ops.norm_mish_mask``: h, mask and addend in any strides; the result in the
    reference's layout, ``[B, C, T]`` over channels-last memory."""
    assert h.ndim == 3 and weight.shape == bias.shape == (h.shape[1],), (h.shape, weight.shape, bias.shape)
    batch, channels, length = h.shape
    assert mask.shape == (batch, 1, length) and mask.dtype == h.dtype, (mask.shape, mask.dtype, h.shape, h.dtype)
    if addend is not None:
        assert addend.dtype == h.dtype, (addend.dtype, h.dtype)
        addend = addend.expand(batch, channels, length)  # a [B, C, 1] term: stride 0 over T
    out = torch.empty((batch, length, channels), dtype=h.dtype, device=h.device).transpose(1, 2)
    if out.numel():
        source = h if addend is None else addend
        grid = (batch, triton.cdiv(length, _FRAMES_PER_PROGRAM))
        _norm_mish_mask_kernel[grid](
            h, weight.contiguous(), bias.contiguous(), mask, source, out, channels, length, eps,
            *h.stride(), mask.stride(0), mask.stride(2), *source.stride(), *out.stride(),
            HAS_ADDEND=addend is not None, BLOCK_C=triton.next_power_of_2(channels),
            BLOCK_T=_FRAMES_PER_PROGRAM, num_warps=4)
    return out


def _frames_as_rows(x: torch.Tensor) -> torch.Tensor:
    """``[..., C]`` -> ``[N, C]`` rows with unit channel stride (a view where the layout allows)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


def add_layer_norm_frames_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_ops.add_layer_norm``: T3's kernel over the frames of ``[..., C]`` tensors; both
    results contiguous in x's shape."""
    assert delta.shape == x.shape, (x.shape, delta.shape)
    residual, normed = add_layer_norm_triton(_frames_as_rows(x), _frames_as_rows(delta), weight.contiguous(),
                                             bias.contiguous(), eps)
    return residual.view(x.shape), normed.view(x.shape)


# -------------------------------------------------------------------------------- HiFT convolutions
# Tiles of the fused residual-unit convolution: output channels x samples, reduced over input
# channels per tap. HiFT's channel counts (64, 128, 256) are multiples of 64.
_CONV_BLOCK_CO = 64
_CONV_BLOCK_CI = 64
_CONV_BLOCK_L = 128
_CONV_BLOCK_L_INTERPRETED = 1024  # the interpreter pays per program and per op, not per element
_CONV_WARPS = 4
_CONV_STAGES = 3


@triton.jit(do_not_specialize=["length", "stride_xb", "stride_rb", "stride_ob"])
def _snake_conv_kernel(x_ptr, alpha_ptr, w_ptr, bias_ptr, mask_ptr, res_ptr, out_ptr,
                       c_in, c_out, length, stride_xb, stride_rb, stride_ob,
                       TAPS: tl.constexpr, DILATION: tl.constexpr, PAD: tl.constexpr,
                       HAS_MASK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr, BLOCK_L: tl.constexpr):
    """One output tile ``[BLOCK_CO, BLOCK_L]`` of ``conv1d(snake(mask * x))`` (+ bias), and with a
    residual ``residual + mask * that``. x, residual and out are ``[B, C, L]`` with unit stride
    over L and ``L`` over C; the weight is laid out ``[TAPS, C_out, C_in]``.

    An implicit GEMM: for every tap the input tile shifted by ``tap * DILATION - PAD`` goes
    through Snake in fp32 (recomputed per tap and per output tile: a sine is cheap next to the
    bytes it saves) and is rounded once to the weight's dtype for the tensor cores; the sum stays
    fp32 until the one rounding at the store. Positions outside ``[0, L)`` are the convolution's
    zero padding (Snake of 0 is 0, so padding before or after the activation is the same)."""
    item = tl.program_id(0).to(tl.int64)
    samples = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    outs = tl.program_id(2) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    out_inside = outs < c_out
    acc = tl.zeros((BLOCK_CO, BLOCK_L), dtype=tl.float32)
    x_item = x_ptr + item * stride_xb
    for tap in tl.static_range(TAPS):
        pos = samples + (tap * DILATION - PAD)
        inside = (pos >= 0) & (pos < length)
        if HAS_MASK:
            keep = tl.load(mask_ptr + item * length + pos, mask=inside, other=0.0).to(tl.float32)
        for start in range(0, c_in, BLOCK_CI):
            ins = start + tl.arange(0, BLOCK_CI)
            in_inside = ins < c_in
            x = tl.load(x_item + ins[:, None] * length + pos[None, :],
                        mask=in_inside[:, None] & inside[None, :], other=0.0).to(tl.float32)
            if HAS_MASK:  # the mask is 0 or 1: the product is exact
                x = x * keep[None, :]
            alpha = tl.load(alpha_ptr + ins, mask=in_inside, other=1.0).to(tl.float32)[:, None]
            sine = tl.sin(x * alpha)
            x = x + sine * sine / (alpha + 1e-9)
            w = tl.load(w_ptr + tap * c_out * c_in + outs[:, None] * c_in + ins[None, :],
                        mask=out_inside[:, None] & in_inside[None, :], other=0.0)
            acc = tl.dot(w, x.to(w.dtype), acc, input_precision=PRECISION)
    acc += tl.load(bias_ptr + outs, mask=out_inside, other=0.0).to(tl.float32)[:, None]
    in_length = samples < length
    tile = outs[:, None] * length + samples[None, :]
    tile_inside = out_inside[:, None] & in_length[None, :]
    if HAS_RESIDUAL:
        if HAS_MASK:
            acc = acc * tl.load(mask_ptr + item * length + samples, mask=in_length, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(res_ptr + item * stride_rb + tile, mask=tile_inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + item * stride_ob + tile, acc.to(out_ptr.dtype.element_ty), mask=tile_inside)


def snake_conv_triton(x: torch.Tensor, alpha: torch.Tensor, weight_taps: torch.Tensor, bias: torch.Tensor,
                      dilation: int, padding: int, mask: torch.Tensor | None,
                      residual: torch.Tensor | None) -> torch.Tensor:
    """``fused_ops.snake_conv`` on a weight already laid out ``[taps, C_out, C_in]`` (contiguous)."""
    assert x.ndim == 3 and weight_taps.ndim == 3, (x.shape, weight_taps.shape)
    batch, c_in, length = x.shape
    taps, c_out, c_in_w = weight_taps.shape
    assert c_in_w == c_in and alpha.shape == (c_in,) and bias.shape == (c_out,), (x.shape, weight_taps.shape)
    assert length + 2 * padding - dilation * (taps - 1) == length, "only 'same' convolutions are fused"
    x = x.contiguous()
    if mask is not None:
        assert mask.shape == (batch, 1, length), (mask.shape, x.shape)
        mask = mask.to(x.dtype).contiguous()
    if residual is not None:
        assert residual.shape == (batch, c_out, length), (residual.shape, x.shape)
        residual = residual.contiguous()
    out = torch.empty((batch, c_out, length), dtype=x.dtype, device=x.device)
    if out.numel():
        block_l = _CONV_BLOCK_L if x.is_cuda else _CONV_BLOCK_L_INTERPRETED
        grid = (batch, triton.cdiv(length, block_l), triton.cdiv(c_out, _CONV_BLOCK_CO))
        _snake_conv_kernel[grid](
            x, alpha.contiguous(), weight_taps, bias.contiguous(), x if mask is None else mask,
            x if residual is None else residual, out, c_in, c_out, length,
            x.stride(0), 0 if residual is None else residual.stride(0), out.stride(0),
            TAPS=taps, DILATION=dilation, PAD=padding, HAS_MASK=mask is not None,
            HAS_RESIDUAL=residual is not None,
            # fp32 models multiply in fp32 (no TF32), as their PyTorch path does with TF32 off
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            BLOCK_CO=_CONV_BLOCK_CO, BLOCK_CI=_CONV_BLOCK_CI, BLOCK_L=block_l, num_warps=_CONV_WARPS,
            num_stages=_CONV_STAGES)
    return out


# -------------------------------------------------------------------------------- encoder attention
# Tiles of the relative-position attention (fused_ops.ATTENTION_TILE): queries x keys. A tile's
# position scores span BLOCK_M + BLOCK_N - 1 distances, one dot against that window of the table
# (fused_ops.attention_window rows). Not tuned on a GPU yet.
_ATTN_WARPS = 4
_ATTN_STAGES = 2
_LOG2E = tl.constexpr(1.4426950408889634)


# the length and the strides that step over items and positions vary with every pass's shape
@triton.jit(do_not_specialize=["length", "stride_cb", "stride_pb", "stride_kb", "stride_vb", "stride_mb"])
def _rel_position_attention_kernel(qc_ptr, qp_ptr, k_ptr, v_ptr, p_ptr, mask_ptr, out_ptr, heads, length, scale,
                                   stride_cb, stride_ch, stride_ct, stride_pb, stride_ph, stride_pt,
                                   stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                                   stride_th, stride_tt, stride_mb,
                                   HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """``BLOCK_M`` queries of one item and head against every key, flash-attention style: the
    logits ``(q_c k^T + q_p p_(T-1-i+j)^T) scale`` of a key tile, an online softmax in fp32, and the
    output written once into ``[B, T, H D]``. Query row a and key column b of a tile whose first
    query is m0 and first key n0 need table row ``(T-1) - (m0+a) + (n0+b) = base + (BLOCK_M-1-a) + b``
    with ``base = (T-1) - m0 + n0 - (BLOCK_M-1)``: one dot of the queries against the table's rows
    ``base ... base + BLOCK_M + BLOCK_N - 2`` (``WINDOW`` rows, a power of two) gives every such
    score, and a gather along the window axis picks each (a, b)'s. Keys past T or whose mask is
    False get -inf."""
    start_m = tl.program_id(0) * BLOCK_M
    item = (tl.program_id(1) // heads).to(tl.int64)
    head = (tl.program_id(1) % heads).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    in_rows = rows < length
    q_c = tl.load(qc_ptr + item * stride_cb + head * stride_ch + rows[:, None] * stride_ct + dims[None, :],
                  mask=in_rows[:, None], other=0.0)
    q_p = tl.load(qp_ptr + item * stride_pb + head * stride_ph + rows[:, None] * stride_pt + dims[None, :],
                  mask=in_rows[:, None], other=0.0)
    k_base = k_ptr + item * stride_kb + head * stride_kh
    v_base = v_ptr + item * stride_vb + head * stride_vh
    table = p_ptr + head * stride_th
    window = tl.arange(0, WINDOW)
    pick = (BLOCK_M - 1 - tl.arange(0, BLOCK_M))[:, None] + tl.arange(0, BLOCK_N)[None, :]
    logit_scale = scale * _LOG2E  # exp2 below
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, length, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        in_cols = cols < length
        k_t = tl.load(k_base + cols[None, :] * stride_kt + dims[:, None], mask=in_cols[None, :], other=0.0)
        scores = tl.dot(q_c, k_t, input_precision=PRECISION)
        distance = (length - 1) - start_m + start_n - (BLOCK_M - 1) + window
        in_table = (distance >= 0) & (distance < 2 * length - 1)
        p_t = tl.load(table + distance[None, :] * stride_tt + dims[:, None], mask=in_table[None, :], other=0.0)
        scores += tl.gather(tl.dot(q_p, p_t, input_precision=PRECISION), pick, axis=1)
        keep = in_cols & (tl.load(mask_ptr + item * stride_mb + cols, mask=in_cols, other=0) != 0)
        logits = tl.where(keep[None, :], scores * logit_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: nothing to rescale
        weights = tl.math.exp2(logits - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(weights, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vt + dims[None, :], mask=in_cols[:, None], other=0.0)
        acc = tl.dot(weights.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    row_stride = heads * HEAD_DIM
    tl.store(out_ptr + item * length * row_stride + rows[:, None] * row_stride + head * HEAD_DIM + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=in_rows[:, None])


def rel_position_attention_triton(q_content: torch.Tensor, q_position: torch.Tensor, k: torch.Tensor,
                                  v: torch.Tensor, p: torch.Tensor, key_mask: torch.Tensor, scale: float,
                                  tile: tuple[int, int], window: int) -> torch.Tensor:
    """``fused_ops.rel_position_attention``: q_content, q_position, k, v ``[B, H, T, D]`` in any
    strides with unit stride over D (copied otherwise), p ``[1, H, 2T-1, D]``, key_mask ``[B, T]``
    bool; ``tile`` queries x keys per tile and ``window`` table rows per tile's position dot
    (``fused_ops.ATTENTION_TILE``, ``fused_ops.attention_window``). The result ``[B, T, H D]``
    contiguous in the inputs' dtype."""
    batch, heads, length, head_dim = q_content.shape
    block_m, block_n = tile
    for name, tensor in (("q_position", q_position), ("k", k), ("v", v)):
        assert tensor.shape == q_content.shape, f"{name} {tuple(tensor.shape)} != q_content {tuple(q_content.shape)}"
        assert tensor.dtype == q_content.dtype, f"{name} is {tensor.dtype}, q_content {q_content.dtype}"
    assert p.shape == (1, heads, 2 * length - 1, head_dim) and p.dtype == q_content.dtype, (
        f"p must be [1, {heads}, {2 * length - 1}, {head_dim}] in {q_content.dtype}, got {tuple(p.shape)} {p.dtype}")
    assert key_mask.shape == (batch, length) and key_mask.dtype == torch.bool, (
        f"key_mask must be [{batch}, {length}] bool, got {tuple(key_mask.shape)} {key_mask.dtype}")
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, (
        f"the relative-position attention kernel needs a head dim that is a power of two >= 16 "
        f"(tensor-core tiles), got {head_dim}; run it with backend='torch'")
    assert block_m >= 16 and block_n >= 16 and not block_m & (block_m - 1) and not block_n & (block_n - 1), (
        f"tiles must be powers of two >= 16, got {block_m} x {block_n}")
    assert window >= block_m + block_n - 1 and not window & (window - 1), (
        f"the window must be a power of two >= {block_m + block_n - 1}, got {window}")
    q_content, q_position, k, v, p = (t if t.stride(-1) == 1 else t.contiguous()
                                      for t in (q_content, q_position, k, v, p))
    key_mask = key_mask.contiguous()
    out = torch.empty((batch, length, heads * head_dim), dtype=q_content.dtype, device=q_content.device)
    if out.numel():
        grid = (triton.cdiv(length, block_m), batch * heads)
        _rel_position_attention_kernel[grid](
            q_content, q_position, k, v, p, key_mask.view(torch.uint8), out, heads, length, scale,
            *q_content.stride()[:3], *q_position.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            p.stride(1), p.stride(2), key_mask.stride(0),
            HEAD_DIM=head_dim,
            # fp32 models multiply in fp32 (no TF32), as their PyTorch path does with TF32 off
            PRECISION="ieee" if q_content.dtype == torch.float32 else "tf32",
            BLOCK_M=block_m, BLOCK_N=block_n, WINDOW=window,
            num_warps=_ATTN_WARPS, num_stages=_ATTN_STAGES)
    return out
