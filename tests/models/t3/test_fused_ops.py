"""The fused elementwise ops of the Llama and GPT-2 layers: Triton kernels (under the interpreter
on the CPU) against their PyTorch references, and the regrouped backbones against their layers."""
from __future__ import annotations

import os

import pytest
import torch

from chorus.models.t3 import AttentionCache, T3Model
from chorus.models.t3.fused_ops import (
    add_layer_norm, add_layer_norm_reference, add_rms_norm, add_rms_norm_reference,
    conv1d_gelu_tanh, conv1d_reference, gelu_tanh_reference, rope_qk, rope_reference, silu_mul, silu_mul_reference,
    triton_available,
)
from chorus.models.variants import tiny_variant
from tests.models.t3.weights import random_t3_state

needs_triton = pytest.mark.skipif(
    not triton_available() or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (and TRITON_INTERPRET=1 without a GPU, set by tests/conftest.py)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _assert_rope_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit, under the interpreter and compiled for a GPU alike: the rope kernel is
    compiled without FP contraction, so ``x * cos + rot * sin`` rounds as the tensor ops do."""
    assert torch.equal(got, want)


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


@needs_triton
@pytest.mark.parametrize("rows", [1, 5])
def test_add_rms_norm_kernel_matches_the_reference(rows):
    x, delta, weight = _randn(rows, 96), _randn(rows, 96, seed=1), _randn(96, seed=2)
    residual, normed = add_rms_norm(x, delta, weight, 1e-5, backend="triton")
    ref_residual, ref_normed = add_rms_norm_reference(x, delta, weight, 1e-5)
    assert torch.equal(residual, ref_residual)
    torch.testing.assert_close(normed, ref_normed, rtol=1e-6, atol=1e-6)


@needs_triton
def test_add_rms_norm_kernel_reads_strided_rows():
    wide = _randn(4, 200)
    x, delta = wide[:, :64], wide[:, 100:164]  # row stride 200
    weight = _randn(64, seed=3)
    residual, normed = add_rms_norm(x, delta, weight, 1e-6, backend="triton")
    ref_residual, ref_normed = add_rms_norm_reference(x, delta, weight, 1e-6)
    assert torch.equal(residual, ref_residual)
    torch.testing.assert_close(normed, ref_normed, rtol=1e-6, atol=1e-6)


def _tables(rows: int, head_dim: int, dtype=torch.float32):
    angles = _randn(rows, 1, head_dim // 2, seed=7)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@needs_triton
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_rope_kernel_on_one_projection_output_matches_the_reference(kv_heads):
    rows, heads, head_dim = 3, 4, 16
    qkv = _randn(rows, (heads + 2 * kv_heads) * head_dim)
    q, k, _ = qkv.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    q, k = q.view(rows, heads, head_dim), k.view(rows, kv_heads, head_dim)
    cos, sin = _tables(rows, head_dim)
    got_q, got_k = rope_qk(q, k, cos, sin, backend="triton")
    _assert_rope_equal(got_q, rope_reference(q, cos, sin))
    _assert_rope_equal(got_k, rope_reference(k, cos, sin))


@needs_triton
def test_rope_kernel_on_separate_tensors_matches_the_reference():
    q, k = _randn(2, 3, 8), _randn(2, 3, 8, seed=1)  # 3 heads: padded to 4 in the kernel
    cos, sin = _tables(2, 8)
    got_q, got_k = rope_qk(q, k, cos, sin, backend="triton")
    _assert_rope_equal(got_q, rope_reference(q, cos, sin))
    _assert_rope_equal(got_k, rope_reference(k, cos, sin))


def _back_to_back(rows: int, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU tensors q and k [rows, heads, head_dim] with storages of their own that lie back to
    back in memory: what two separate one-token allocations can look like."""
    memory = torch.randn(2 * rows * heads * head_dim, generator=torch.Generator().manual_seed(0)).numpy()
    half = rows * heads * head_dim
    q = torch.from_numpy(memory[:half]).view(rows, heads, head_dim)
    k = torch.from_numpy(memory[half:]).view(rows, heads, head_dim)
    assert k.data_ptr() == q.data_ptr() + half * q.element_size()
    return q, k


@needs_triton
def test_rope_kernel_takes_back_to_back_tensors_for_separate_ones():
    from chorus.models.t3.triton_ops import adjacent_heads

    q, k = _back_to_back(1, 3, 8)
    assert not adjacent_heads(q, k)
    qkv = _randn(1, 3 * 3 * 8)
    assert adjacent_heads(qkv[:, :24].view(1, 3, 8), qkv[:, 24:48].view(1, 3, 8))


@pytest.mark.skipif(DEVICE != "cpu", reason="builds CPU tensors from numpy")
@needs_triton
def test_rope_kernel_on_back_to_back_tensors_matches_the_reference():
    q, k = _back_to_back(1, 3, 8)
    cos, sin = _tables(1, 8)
    got_q, got_k = rope_qk(q, k, cos, sin, backend="triton")  # one launch over both would read past q
    _assert_rope_equal(got_q, rope_reference(q, cos, sin))
    _assert_rope_equal(got_k, rope_reference(k, cos, sin))


@needs_triton
@pytest.mark.parametrize("inner", [48, 1500])  # one block, and several with a ragged tail
def test_silu_mul_kernel_matches_the_reference(inner):
    gate_up = _randn(3, 2 * inner)
    torch.testing.assert_close(silu_mul(gate_up, backend="triton"), silu_mul_reference(gate_up),
                               rtol=1e-6, atol=1e-6)


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        silu_mul(torch.zeros(1, 4), backend="cuda")


def _tiny_llama():
    config = tiny_variant("original").t3
    return config, T3Model.from_state_dict(config, random_t3_state(config, 0))


def test_fused_projections_keep_the_state_dict():
    config, model = _tiny_llama()
    state = random_t3_state(config, 0)
    for key, value in model.state_dict().items():
        if key in state:
            assert torch.equal(value, state[key].to(value.dtype)), key
    attn = model.tfmr.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.v_proj.weight.untyped_storage().data_ptr()


class _DenseCache(AttentionCache):
    """A full-sequence causal attention over the current call's tokens (one sequence)."""

    def attend(self, layer, q, k, v):
        scores = torch.einsum("nhd,mhd->hnm", q, k) / q.shape[-1] ** 0.5
        causal = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool, device=q.device).tril()
        return torch.einsum("hnm,mhd->nhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), v)


def test_the_regrouped_backbone_equals_its_layers_in_turn():
    _, model = _tiny_llama()
    backbone = model.tfmr
    embeds, positions = _randn(7, backbone.config.hidden_size).cpu(), torch.arange(7)
    got = backbone(embeds, positions, _DenseCache())
    cos, sin = backbone.rotary.cos_sin(positions)
    x = embeds
    for index, layer in enumerate(backbone.layers):
        x = layer(x, cos, sin, index, _DenseCache())
    assert torch.equal(got, backbone.norm(x))


# ------------------------------------------------------------------------------ GPT-2
# The LayerNorm statistics are fp32 sums in another order than PyTorch's (and 1 / sqrt instead of
# rsqrt): the normed values can differ from the reference in their last fp32 bits, never more
# (1e-6 on values of order one).
FP32_LAST_BITS = dict(rtol=1e-6, atol=1e-6)


@needs_triton
@pytest.mark.parametrize("rows", [1, 5])
def test_add_layer_norm_kernel_matches_the_reference(rows):
    x, delta = _randn(rows, 96), _randn(rows, 96, seed=1)  # 96: a masked tail in a 128-wide block
    weight, bias = _randn(96, seed=2), _randn(96, seed=3)
    residual, normed = add_layer_norm(x, delta, weight, bias, 1e-5, backend="triton")
    ref_residual, ref_normed = add_layer_norm_reference(x, delta, weight, bias, 1e-5)
    assert torch.equal(residual, ref_residual)
    torch.testing.assert_close(normed, ref_normed, **FP32_LAST_BITS)


@needs_triton
def test_add_layer_norm_kernel_reads_strided_rows():
    wide = _randn(4, 200) + 3.0  # a mean far from zero: the variance is taken about it
    x, delta = wide[:, :64], wide[:, 100:164]  # row stride 200
    weight, bias = _randn(64, seed=3), _randn(64, seed=4)
    residual, normed = add_layer_norm(x, delta, weight, bias, 1e-5, backend="triton")
    ref_residual, ref_normed = add_layer_norm_reference(x, delta, weight, bias, 1e-5)
    assert torch.equal(residual, ref_residual)
    torch.testing.assert_close(normed, ref_normed, **FP32_LAST_BITS)


@needs_triton
def test_conv1d_gelu_tanh_runs_the_reference_off_cuda():
    # the fused GEMM + GELU is a cuBLASLt epilogue; on the CPU torch._addmm_activation would be
    # the exact erf GELU, so even a forced "triton" backend must keep the tanh reference there
    h, weight, bias = _randn(2, 64).cpu(), _randn(64, 256, seed=1).cpu() / 8, _randn(256, seed=2).cpu()
    assert torch.equal(conv1d_gelu_tanh(h, weight, bias, backend="triton"),
                       gelu_tanh_reference(conv1d_reference(h, weight, bias)))


def _tiny_gpt2():
    config = tiny_variant("turbo").t3
    return T3Model.from_state_dict(config, random_t3_state(config, 0))


def test_the_regrouped_gpt2_backbone_equals_its_layers_in_turn():
    backbone = _tiny_gpt2().tfmr
    backbone.ops_backend = "torch"
    embeds, positions = _randn(7, backbone.config.hidden_size).cpu(), torch.arange(7)
    got = backbone(embeds, positions, _DenseCache())
    x = embeds + backbone.wpe(positions)
    for index, layer in enumerate(backbone.h):
        x = layer(x, index, _DenseCache())
    assert torch.equal(got, backbone.ln_f(x))


def test_the_gpt2_backbone_runs_the_references_on_the_cpu_by_default():
    backbone = _tiny_gpt2().tfmr
    embeds, positions = _randn(5, backbone.config.hidden_size).cpu(), torch.arange(5)
    got = backbone(embeds, positions, _DenseCache())  # "auto" on CPU tensors
    backbone.ops_backend = "torch"
    assert torch.equal(got, backbone(embeds, positions, _DenseCache()))


def test_the_fused_gpt2_backbone_keeps_the_state_dict():
    config = tiny_variant("turbo").t3
    state = random_t3_state(config, 0)
    model = T3Model.from_state_dict(config, state)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key].to(value.dtype)), key


@needs_triton
def test_the_gpt2_backbone_with_the_kernels_tracks_the_references():
    backbone = _tiny_gpt2().tfmr.to(DEVICE)
    embeds, positions = _randn(6, backbone.config.hidden_size), torch.arange(6, device=DEVICE)
    backbone.ops_backend = "torch"
    expected = backbone(embeds, positions, _DenseCache())
    backbone.ops_backend = "triton"
    got = backbone(embeds, positions, _DenseCache())
    # last-bit differences of every fused norm, carried through two layers
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
