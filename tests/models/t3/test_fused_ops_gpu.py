"""The fused ops compiled for the GPU: bf16 kernels against their references, and a whole T3
forward with the kernels against the same model with the plain ops."""
from __future__ import annotations

import pytest
import torch

from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.bench.speed_of_light import DecodeShape, PlainDecodeModel, PlainDecodeStep
from chorus.models.t3.fused_ops import (
    add_layer_norm, add_layer_norm_reference, add_rms_norm, add_rms_norm_reference,
    conv1d_gelu_tanh, conv1d_reference, gelu_tanh_reference, rope_qk, rope_reference, silu_mul, silu_mul_reference,
)
from chorus.models.variants import get_variant, tiny_variant
from tests.models.t3.weights import random_t3_state

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def _randn(*shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda").to(BF16)


@pytest.mark.parametrize("rows", [1, 7, 512])
def test_bf16_add_rms_norm(rows):
    x, delta, weight = _randn(rows, 1024), _randn(rows, 1024, seed=1), _randn(1024, seed=2)
    residual, normed = add_rms_norm(x, delta, weight, 1e-5, backend="triton")
    ref_residual, ref_normed = add_rms_norm_reference(x, delta, weight, 1e-5)
    assert torch.equal(residual, ref_residual)
    # the fp32 sum may round differently, which can move a value by one bf16 step
    torch.testing.assert_close(normed, ref_normed, rtol=1e-2, atol=1e-2)
    assert (normed != ref_normed).float().mean() < 0.01


@pytest.mark.parametrize("rows", [1, 512])
def test_bf16_rope_on_a_fused_projection(rows):
    qkv = _randn(rows, 3 * 1024)
    q, k, _ = qkv.split(1024, dim=-1)
    q, k = q.view(rows, 16, 64), k.view(rows, 16, 64)
    angles = torch.rand(rows, 1, 32, device="cuda") * 100
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(BF16), angles.sin().to(BF16)
    got_q, got_k = rope_qk(q, k, cos, sin, backend="triton")
    # compiled without FP contraction, the kernel rounds each product and the sum as the plain
    # bf16 ops do
    assert torch.equal(got_q, rope_reference(q, cos, sin))
    assert torch.equal(got_k, rope_reference(k, cos, sin))


@pytest.mark.parametrize("rows", [1, 512])
def test_bf16_silu_mul(rows):
    gate_up = _randn(rows, 2 * 4096)
    got, ref = silu_mul(gate_up, backend="triton"), silu_mul_reference(gate_up)
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)
    assert (got != ref).float().mean() < 0.01


def _decode_logits(model: T3Model, config) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    speaker, prompt = torch.randn(1, 256, generator=g), torch.randint(0, 6561, (1, 30), generator=g)
    text = torch.randint(1, 255, (9,), generator=g)
    cond = model.encode_conditioning(speaker, prompt, 0.5)
    runner = T3SingleSequence(model, cond, text, cfg=config.supports_cfg, max_new_tokens=6)
    return torch.stack([runner.prefill()] + [runner.decode(t) for t in (1, 200, 3000, 7, 8)]).float()


@pytest.mark.parametrize("variant", [tiny_variant("original"), get_variant("original"), tiny_variant("turbo"),
                                     get_variant("turbo")], ids=["tiny", "full", "tiny-turbo", "full-turbo"])
def test_a_bf16_forward_with_the_kernels_tracks_fp32_as_the_plain_ops_do(variant):
    config = variant.t3
    state = random_t3_state(config, 0)
    fp32 = T3Model.from_state_dict(config, state, device="cuda")
    fp32.tfmr.ops_backend = "torch"
    reference = _decode_logits(fp32, config)
    del fp32
    model = T3Model.from_state_dict(config, state, dtype=BF16, device="cuda")
    model.tfmr.ops_backend = "torch"
    plain = _decode_logits(model, config)
    model.tfmr.ops_backend = "triton"
    fused = _decode_logits(model, config)
    cosine = torch.nn.functional.cosine_similarity
    fused_vs_fp32 = float(cosine(fused, reference, dim=-1).min())
    plain_vs_fp32 = float(cosine(plain, reference, dim=-1).min())
    assert fused_vs_fp32 > 0.999  # the engine's accuracy bar for bf16
    assert fused_vs_fp32 > plain_vs_fp32 - 5e-4  # the kernels cost no accuracy beyond bf16's own


# ------------------------------------------------------------------------------ GPT-2
def _bf16_steps(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| in bf16 steps at ref (a value in [2^(e-1), 2^e) has steps of 2^(e-8))."""
    ref32 = ref.float()
    exponent = torch.frexp(ref32.abs().clamp_min(2.0 ** -126)).exponent
    return (got.float() - ref32).abs() / torch.ldexp(torch.ones_like(ref32), exponent - 8)


@pytest.mark.parametrize("rows", [1, 7, 512])
def test_bf16_add_layer_norm(rows):
    x, delta = _randn(rows, 1024), _randn(rows, 1024, seed=1)
    weight, bias = _randn(1024, seed=2), _randn(1024, seed=3)
    residual, normed = add_layer_norm(x, delta, weight, bias, 1e-5, backend="triton")
    ref_residual, ref_normed = add_layer_norm_reference(x, delta, weight, bias, 1e-5)
    assert torch.equal(residual, ref_residual)
    # the fp32 statistics sum in another order: a value may round the other way, one step at most
    assert float(_bf16_steps(normed, ref_normed).max()) <= 1
    assert (normed != ref_normed).float().mean() < 0.01


def _projection(rows: int, inner: int, out: int, dtype=BF16):
    g = torch.Generator(device="cuda").manual_seed(4)
    h = torch.randn(rows, inner, generator=g, device="cuda")
    weight = torch.randn(inner, out, generator=g, device="cuda") / inner ** 0.5
    return h.to(dtype), weight.to(dtype), torch.randn(out, generator=g, device="cuda").to(dtype)


@pytest.mark.parametrize("rows", [1, 2, 512])
def test_the_gelu_epilogue_is_the_tanh_approximation(rows):
    # in fp32 the tanh and erf GELUs differ by up to ~5e-4, far above the GEMM's rounding
    h, weight, bias = _projection(rows, 1024, 4096, dtype=torch.float32)
    got = conv1d_gelu_tanh(h, weight, bias, backend="triton")
    pre = conv1d_reference(h, weight, bias)
    tanh_error = float((got - gelu_tanh_reference(pre)).abs().max())
    erf_error = float((got - torch.nn.functional.gelu(pre)).abs().max())
    assert tanh_error < 1e-4 < erf_error, (tanh_error, erf_error)


@pytest.mark.parametrize("rows", [1, 512])
def test_bf16_conv1d_gelu_tanh(rows):
    h, weight, bias = _projection(rows, 1024, 4096)
    got = conv1d_gelu_tanh(h, weight, bias, backend="triton")
    plain = gelu_tanh_reference(conv1d_reference(h, weight, bias))
    exact = gelu_tanh_reference(conv1d_reference(h.float(), weight.float(), bias.float()))
    # the epilogue applies GELU before the one rounding, where the plain ops round twice: values
    # move by a step or two of the plain result, towards the exact one
    torch.testing.assert_close(got, plain, rtol=2e-2, atol=2e-2)
    assert (got.float() - exact).abs().mean() <= (plain.float() - exact).abs().mean()


def _kernels_per_step(model: PlainDecodeModel, backend: str) -> int:
    model.tfmr.ops_backend = backend
    step = PlainDecodeStep(model, DecodeShape(rows=1, context_tokens=64), cuda_graph=False)
    step()  # lazy initialisation and Triton compilation outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def test_the_fused_gpt2_layer_launches_fewer_kernels():
    config = get_variant("turbo").t3
    model = PlainDecodeModel.build(config, dtype=BF16, device="cuda")
    plain, fused = _kernels_per_step(model, "torch"), _kernels_per_step(model, "triton")
    # per layer: two LayerNorms with their residual adds become two kernels, and the GELU joins the
    # up-projection's GEMM (docs/t3.md)
    assert plain - fused >= 3 * config.backbone.num_layers, (plain, fused)
