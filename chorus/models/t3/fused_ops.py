"""The elementwise steps of the Llama and GPT-2 decoder layers, each one kernel on CUDA.

A decode step at small batch is bound by kernel launches, not arithmetic: written as plain
tensor ops, an RMSNorm with its residual add, the rotary embedding of q and k, and SwiGLU's
gate are some twenty launches per layer. Each function here is one Triton kernel for CUDA
tensors (``chorus/models/t3/triton_ops.py``) and the same arithmetic in PyTorch elsewhere,
which is the reference the kernels are tested against. The kernels round where the plain ops
round (every bf16 product and sum), so they agree bit for bit in fp32; compiled in bf16 a value
can move by one bf16 step (docs/t3.md, "Fewer kernels per Llama layer").

GPT-2's MLP up-projection and GELU (``conv1d_gelu_tanh``) are not a Triton kernel but one
cuBLASLt GEMM with a bias and GELU epilogue on CUDA (docs/t3.md, "Fewer kernels per GPT-2
layer"); it follows the same backend rule.

``backend``: ``"auto"``, ``"triton"`` or ``"torch"``, chosen as for every kernel package
(:mod:`chorus.triton_backend`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from chorus.triton_backend import kernels_import, use_triton

_KERNELS = "chorus.models.t3.triton_ops"


def triton_available() -> bool:
    return kernels_import(_KERNELS)


def uses_triton(backend: str, tensor: torch.Tensor) -> bool:
    """Whether the fused ops with ``backend`` run the Triton kernels for ``tensor``."""
    return use_triton(backend, tensor, _KERNELS, "fused ops")


# ------------------------------------------------------------------------------ references
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * rms_norm(x)`` with the statistics in fp32 (as the reference Llama does)."""
    normed = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual = x + delta
    return residual, rms_norm_reference(residual, weight, eps)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [N, heads, head_dim] by the tables [N, 1, head_dim] (in x's dtype): dim i of a
    head pairs with dim i + head_dim / 2 (``x * cos + rotate_half(x) * sin``)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def conv1d_reference(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A GPT-2 Conv1D projection of h [N, in] by weight [in, out] and bias [out]."""
    return torch.addmm(bias, h, weight)


def add_layer_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual = x + delta
    return residual, F.layer_norm(residual, (residual.shape[-1],), weight, bias, eps)


def gelu_tanh_reference(h: torch.Tensor) -> torch.Tensor:
    """GPT-2's "gelu_new": the tanh approximation of GELU."""
    return F.gelu(h, approximate="tanh")


# ------------------------------------------------------------------------------ dispatch
def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, weight * rms_norm(x + delta)) for [N, D] tensors: the residual stream and
    the next sublayer's input."""
    if uses_triton(backend, x):
        from chorus.models.t3.triton_ops import add_rms_norm_triton

        return add_rms_norm_triton(x, delta, weight, eps)
    return add_rms_norm_reference(x, delta, weight, eps)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q [N, Hq, Dh] and k [N, Hk, Dh] (views of one projection output are
    fine) with tables [N, 1, Dh] in their dtype; returns new tensors."""
    if uses_triton(backend, q):
        from chorus.models.t3.triton_ops import rope_qk_triton

        return rope_qk_triton(q, k, cos, sin)
    return rope_reference(q, cos, sin), rope_reference(k, cos, sin)


def silu_mul(gate_up: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` of a [N, 2I] gate|up projection -> [N, I]."""
    if uses_triton(backend, gate_up):
        from chorus.models.t3.triton_ops import silu_mul_triton

        return silu_mul_triton(gate_up)
    return silu_mul_reference(gate_up)


def add_layer_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                   backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, layer_norm(x + delta)) for [N, D] tensors: the residual stream and the next
    sublayer's input."""
    if uses_triton(backend, x):
        from chorus.models.t3.triton_ops import add_layer_norm_triton

        return add_layer_norm_triton(x, delta, weight, bias, eps)
    return add_layer_norm_reference(x, delta, weight, bias, eps)


def conv1d_gelu_tanh(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     backend: str = "auto") -> torch.Tensor:
    """``gelu_tanh(conv1d(h))``, GPT-2's MLP up-projection and activation. On CUDA it is one
    cuBLASLt GEMM whose epilogue adds the bias and applies GELU to the fp32 sums before their one
    rounding (``torch._addmm_activation``; on CUDA its GELU is the tanh approximation, see
    docs/t3.md). Elsewhere the reference runs: on the CPU that op computes the exact erf GELU."""
    if h.is_cuda and uses_triton(backend, h):
        return torch._addmm_activation(bias, h, weight, use_gelu=True)
    return gelu_tanh_reference(conv1d_reference(h, weight, bias))
