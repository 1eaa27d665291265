"""The one rule for choosing between a Triton kernel and its PyTorch reference.

Kernel packages (``chorus.engine.attention``, ``chorus.models.t3.fused_ops``) take a
``backend`` argument: ``"auto"`` (Triton for CUDA tensors when the kernel module imports, else
PyTorch), ``"triton"`` or ``"torch"`` to force one. Forcing Triton on CPU tensors only works
under the Triton interpreter (``TRITON_INTERPRET=1`` set before the kernels are first imported),
which the tests use. Kernel modules are imported lazily, so Chorus imports without Triton.
"""
from __future__ import annotations

import functools
import importlib

import torch

BACKENDS = ("auto", "triton", "torch")


@functools.cache
def kernels_import(module: str) -> bool:
    """Whether the Triton kernel module ``module`` imports (Triton installed, kernels compile)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def use_triton(backend: str, tensor: torch.Tensor, module: str, what: str) -> bool:
    """Whether ``what`` (e.g. "attention") runs ``module``'s Triton kernels for ``tensor``."""
    return use_triton_on(backend, tensor.device, module, what)


def use_triton_on(backend: str, device: torch.device, module: str, what: str) -> bool:
    """:func:`use_triton` for work on ``device`` (where no tensor is at hand)."""
    if backend not in BACKENDS:
        raise ValueError(f"{what} backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return device.type == "cuda" and kernels_import(module)
    if backend == "triton" and not kernels_import(module):
        raise RuntimeError(f"{what} backend 'triton' was requested but Triton is not installed")
    return backend == "triton"
