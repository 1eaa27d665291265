"""HiFT's elementwise steps, one kernel each on CUDA.

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

``backend``: ``"auto"``, ``"triton"`` or ``"torch"``, chosen as for every kernel package
(:mod:`chorus.triton_backend`).
"""
from __future__ import annotations

import torch

from chorus.triton_backend import kernels_import, use_triton

_KERNELS = "chorus.models.s3gen.triton_ops"


def triton_available() -> bool:
    return kernels_import(_KERNELS)


def uses_triton(backend: str, tensor: torch.Tensor) -> bool:
    """Whether HiFT's fused ops with ``backend`` run the Triton kernel for ``tensor``."""
    return use_triton(backend, tensor, _KERNELS, "HiFT ops")


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
    if not torch.compiler.is_compiling() and uses_triton(backend, x):
        from chorus.models.s3gen.triton_ops import snake_triton

        return snake_triton(x, alpha, mask)
    return snake_reference(x, alpha, mask)


def masked_residual(x: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x + mask * delta`` in one kernel (``x + delta`` without a mask)."""
    return x + delta if mask is None else torch.addcmul(x, delta, mask)
