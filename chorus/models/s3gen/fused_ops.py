"""S3Gen's elementwise steps, one kernel each on CUDA: HiFT's Snake and the flow estimator's norms.

HiFT's residual units run ``Snake -> conv -> mask -> Snake -> conv -> mask -> + residual`` over
activations of up to 64 channels x 480 samples per mel frame. Written as plain tensor ops, one
Snake (``x + sin(alpha x)^2 / alpha``) is five passes over memory and each mask and residual add
one more: about thirteen passes per unit, against two convolutions. On an H200 those passes were
about two thirds of HiFT's device time (docs/vocoder.md, "Fused Snake").

:func:`snake` is one Triton kernel for CUDA tensors (``chorus/models/s3gen/triton_ops.py``),
with the mask that precedes it folded in, and the same arithmetic in PyTorch elsewhere, which is
the reference the kernel is tested against. The kernel rounds where the plain ops round (every
bf16 product, sine and sum), so its result differs from the reference only where Triton's sine
and PyTorch's differ in the last bit of fp32. :func:`masked_residual` is ``torch.addcmul``, one
kernel on every device and bitwise the reference (the mask is 0 or 1, so the product is exact).

The flow's estimator (``chorus/models/s3gen/estimator.py``) spends about as much of its time in
LayerNorms, the layout copies around them, Mish, masks and residual adds as in attention and
GEMMs (docs/vocoder.md, "The flow's kernels at a first window"). Two functions take that work:

- :func:`norm_mish_mask`, a causal block's tail ``mish(LayerNorm over channels of h) * mask``
  with an optional term added after the mask, one Triton kernel that reads ``h`` channels-first
  (no transposes); its reference is the estimator's op sequence as written before the kernel.
- :func:`add_layer_norm`, a transformer block's residual add and the LayerNorm that follows it.
  That is T3's GPT-2 kernel (:func:`chorus.models.t3.fused_ops.add_layer_norm`), with its
  reference, applied to the frames of ``[B, T, C]`` tensors as rows: one kernel for both models.

Both kernels round where the plain ops round, so they differ from the references only in the
norm statistics (fp32 sums in another order) and Mish's fp32 arithmetic (docs/vocoder.md, "Fused
flow norms"). Unlike HiFT's ops, an estimator runs the references unless told otherwise
(``ConditionalDecoder.ops_backend``), so a model outside the vocoder stage stays bitwise what it
was; the stage runs the kernels by default (``VocoderConfig.flow_ops``).

The flow encoder's relative-position attention (``chorus/models/s3gen/encoder.py``) built the
position term as tensors: ``q_position p^T`` over the 2T-1 distances ``[B, H, T, 2T-1]``, its
re-indexing to keys (a copy), a scale and the key mask, then SDPA with that float bias
``[B, H, T, T]``: several passes over ``B H T^2`` values per layer.
:func:`rel_position_attention` is one flash-attention kernel that computes the position term
per tile and never stores a ``T x T`` score; its reference is the encoder's ops as written before
the kernel. It is opt-in (``RelPositionAttention.ops_backend``, ``VocoderConfig.encoder_attention_ops``):
not measured on a GPU yet.

``backend``: ``"auto"``, ``"triton"`` or ``"torch"``, chosen as for every kernel package
(:mod:`chorus.triton_backend`). Under ``torch.compile`` every function traces its reference's
ops instead, for the compiler to fuse with what surrounds them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from chorus.models.t3.fused_ops import add_layer_norm_reference
from chorus.triton_backend import kernels_import, use_triton, use_triton_on

_KERNELS = "chorus.models.s3gen.triton_ops"


def triton_available() -> bool:
    return kernels_import(_KERNELS)


def _runs_kernel(backend: str, tensor: torch.Tensor, what: str) -> bool:
    """Whether ``what`` with ``backend`` runs its Triton kernel for ``tensor``: never while
    ``torch.compile`` traces (the compiler fuses the reference's ops with what surrounds them)."""
    return not torch.compiler.is_compiling() and use_triton(backend, tensor, _KERNELS, what)


# ------------------------------------------------------------------------------------- HiFT
def snake_reference(x: torch.Tensor, alpha: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``Snake(mask * x)``: ``x + sin(alpha x)^2 / alpha`` per channel, x ``[B, C, L]``, alpha
    ``[C]``, mask ``[B, 1, L]`` of zeros and ones or None."""
    if mask is not None:
        x = x * mask
    a = alpha[None, :, None]
    return x + (1.0 / (a + 1e-9)) * torch.sin(x * a).pow(2)


def snake(x: torch.Tensor, alpha: torch.Tensor, mask: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """:func:`snake_reference`, one kernel on CUDA. Under ``torch.compile`` the reference's ops
    are traced instead, for the compiler to fuse with what surrounds them."""
    if _runs_kernel(backend, x, "HiFT ops"):
        from chorus.models.s3gen.triton_ops import snake_triton

        return snake_triton(x, alpha, mask)
    return snake_reference(x, alpha, mask)


def masked_residual(x: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x + mask * delta`` in one kernel (``x + delta`` without a mask)."""
    return x + delta if mask is None else torch.addcmul(x, delta, mask)


def snake_conv_reference(x: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         dilation: int, padding: int, mask: torch.Tensor | None = None,
                         residual: torch.Tensor | None = None) -> torch.Tensor:
    """A residual unit's half: ``conv1d(Snake(mask * x))`` with the conv's bias, and with a
    ``residual`` the masked residual ``residual + mask * that``. Shapes: x ``[B, C_in, L]``, alpha
    ``[C_in]``, weight ``[C_out, C_in, K]``, a 'same' convolution (the output has L samples)."""
    y = F.conv1d(snake_reference(x, alpha, mask), weight, bias, padding=padding, dilation=dilation)
    return y if residual is None else masked_residual(residual, y, mask)


def _weight_taps(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[C_out, C_in, K]`` laid out ``[K, C_out, C_in]`` for the kernel, made once per
    weight and kept on it (made again if the weight is changed in place: its version moves)."""
    cached = getattr(weight, "_chorus_taps", None)
    if cached is None or cached[0] != weight._version:
        cached = (weight._version, weight.detach().permute(2, 0, 1).contiguous())
        weight._chorus_taps = cached
    return cached[1]


def snake_conv(x: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               dilation: int, padding: int, mask: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """:func:`snake_conv_reference` as one Triton kernel on CUDA: Snake on the input tile as it
    is loaded, the convolution as an implicit GEMM with fp32 sums, bias, mask and residual added
    before the one store. The reference runs elsewhere: Snake (itself one kernel on CUDA), the
    convolution, then the masked residual, each rounding to the activations' dtype."""
    if _runs_kernel(backend, x, "HiFT ops"):
        from chorus.models.s3gen.triton_ops import snake_conv_triton

        return snake_conv_triton(x, alpha, _weight_taps(weight), bias, dilation, padding, mask, residual)
    return snake_conv_reference(x, alpha, weight, bias, dilation, padding, mask, residual)


# ------------------------------------------------------------------------------------- flow
def norm_mish_mask_reference(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                             mask: torch.Tensor, addend: torch.Tensor | None = None) -> torch.Tensor:
    """``mish(LayerNorm(h) over channels) * mask (+ addend)``, as the estimator's causal blocks
    computed it before the kernel: h ``[B, C, T]``, weight and bias ``[C]``, mask ``[B, 1, T]`` of
    zeros and ones, addend broadcastable to ``[B, C, T]`` (e.g. ``[B, C, 1]``) or None. The
    result has the layout these ops give, channels-last in memory (strides ``(C T, 1, C)``)."""
    normed = F.layer_norm(h.transpose(1, 2), (h.shape[1],), weight, bias, eps).transpose(1, 2)
    out = F.mish(normed) * mask
    return out if addend is None else out + addend


def norm_mish_mask(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, mask: torch.Tensor,
                   addend: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """:func:`norm_mish_mask_reference`, one kernel on CUDA. The kernel needs mask and addend in
    h's dtype; the addend may be any strided view (a ``[B, C, 1]`` term is read with stride 0
    over T). Its result has the reference's layout, so what follows sees the same strides."""
    if _runs_kernel(backend, h, "flow ops"):
        from chorus.models.s3gen.triton_ops import norm_mish_mask_triton

        return norm_mish_mask_triton(h, weight, bias, eps, mask, addend)
    return norm_mish_mask_reference(h, weight, bias, eps, mask, addend)


def add_layer_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                   backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, LayerNorm(x + delta)) over the last axis of ``[..., C]`` tensors (a transformer
    block's residual stream and the next sublayer's input), one kernel on CUDA: T3's, with every
    frame a row. Both results are contiguous from the kernel."""
    if _runs_kernel(backend, x, "flow ops"):
        from chorus.models.s3gen.triton_ops import add_layer_norm_frames_triton

        return add_layer_norm_frames_triton(x, delta, weight, bias, eps)
    return add_layer_norm_reference(x, delta, weight, bias, eps)


# ------------------------------------------------------------------------------- encoder attention
def relative_to_absolute(scores: torch.Tensor) -> torch.Tensor:
    """Re-index ``[..., T, 2T-1]`` scores over distances (table order) to ``[..., T, T]`` over keys.

    Entry ``[i, j]`` of the result is entry ``[i, (T-1) - i + j]`` of the input, the score for
    distance ``i - j``: a strided view, no copy.
    """
    scores = scores.contiguous()
    *lead, length, span = scores.shape
    assert span == 2 * length - 1
    lead_strides = scores.stride()[:-2]
    return scores.as_strided(
        (*lead, length, length),
        (*lead_strides, span - 1, 1),
        scores.storage_offset() + length - 1,
    )


ATTENTION_TILE = (64, 64)
"""Queries x keys per tile of the encoder attention kernel (not tuned on a GPU yet)."""


def attention_window(block_m: int, block_n: int) -> int:
    """Table rows one tile's position dot reads: the ``block_m + block_n - 1`` distances the tile
    spans, padded to a power of two (128 for tiles of 64 x 64)."""
    return 1 << (block_m + block_n - 2).bit_length()


def rel_position_attention_fused(backend: str, device: torch.device) -> bool:
    """Whether :func:`rel_position_attention` with ``backend`` runs its kernel on ``device``
    (outside ``torch.compile``): what the dispatcher runs and the roofline counts the encoder's
    attention as."""
    return not torch.compiler.is_compiling() and use_triton_on(backend, torch.device(device), _KERNELS,
                                                                "encoder attention")


def rel_position_attention_reference(q_content: torch.Tensor, q_position: torch.Tensor, k: torch.Tensor,
                                     v: torch.Tensor, p: torch.Tensor, key_mask: torch.Tensor,
                                     scale: float) -> torch.Tensor:
    """Transformer-XL attention with relative positions, as the encoder computed it before the
    kernel: softmax over keys of ``(q_content k^T + q_position p_(T-1-i+j)^T) scale``, keys whose
    ``key_mask`` is False left out, times v. q_content, q_position, k, v ``[B, H, T, D]``; p
    ``[1, H, 2T-1, D]``, the distance table (row ``(T-1) - i + j`` for query i and key j);
    key_mask ``[B, T]`` bool (True = valid). Returns ``[B, T, H D]`` (heads side by side, the
    output projection's input)."""
    batch, heads, length, head_dim = q_content.shape
    position_scores = relative_to_absolute(torch.matmul(q_position, p.transpose(-2, -1)))
    bias = (position_scores * scale).masked_fill(~key_mask[:, None, None, :], float("-inf"))
    out = F.scaled_dot_product_attention(q_content, k, v, attn_mask=bias, scale=scale)
    return out.transpose(1, 2).reshape(batch, length, heads * head_dim)


def rel_position_attention(q_content: torch.Tensor, q_position: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           p: torch.Tensor, key_mask: torch.Tensor, scale: float, backend: str = "auto",
                           tile: tuple[int, int] = ATTENTION_TILE) -> torch.Tensor:
    """:func:`rel_position_attention_reference` as one Triton kernel on CUDA: per tile of queries
    and keys, the content scores and the position scores (one dot against the window of the
    table that the tile's distances span, then a gather per (query, key)) in fp32, an online
    softmax, the output written once into ``[B, T, H D]``. No ``T x T`` tensor is stored. The
    kernel needs a power-of-two head dim >= 16 (64 in every Chatterbox checkpoint). ``tile``: the
    kernel's queries x keys per tile, powers of two >= 16 (tests take small ones)."""
    if rel_position_attention_fused(backend, q_content.device):
        from chorus.models.s3gen.triton_ops import rel_position_attention_triton

        return rel_position_attention_triton(q_content, q_position, k, v, p, key_mask, scale, tile,
                                             attention_window(*tile))
    return rel_position_attention_reference(q_content, q_position, k, v, p, key_mask, scale)
