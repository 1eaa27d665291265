import pytest
import torch

from chorus.models.fp8 import (
    E4M3, E4M3_MAX, dequantize, fp8_linear, fp8_linear_reference, parse_fp8_stages, quantize_rows, quantize_weight,
)

# E4M3 keeps 3 mantissa bits: a value in the normal range rounds to within half a step, 2**-4 of
# itself; below it (2**-6 in scaled units) the step is 2**-9, so half of it 2**-10 times the scale
HALF_STEP = 2.0 ** -4
HALF_SUBNORMAL_STEP = 2.0 ** -10


def test_weight_round_trip_is_within_half_an_e4m3_step_per_channel():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 32).reshape(-1, 1)
    q = quantize_weight(w)
    assert q.weight.dtype == E4M3 and q.weight.shape == (32, 64) and q.scale.shape == (32,)
    assert q.scale.dtype == torch.float32
    back = dequantize(q.weight, q.scale)
    bound = torch.maximum(w.abs() * HALF_STEP * 1.0001, q.scale.reshape(-1, 1) * HALF_SUBNORMAL_STEP)
    assert ((back - w).abs() <= bound).all()


def test_each_channel_s_largest_value_maps_to_e4m3_max():
    w = torch.tensor([[1.0, -3.0, 0.5], [200.0, 1.0, -2.0]])
    q = quantize_weight(w)
    assert q.weight.float().abs().amax(dim=1).tolist() == [E4M3_MAX, E4M3_MAX]
    assert torch.allclose(q.scale, torch.tensor([3.0, 200.0]) / E4M3_MAX)


def test_an_all_zero_row_quantises_to_zeros_with_a_finite_scale():
    x = torch.zeros(2, 16)
    x[1] = 1.0
    q, scale = quantize_rows(x)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert (q[0].float() == 0).all()
    assert torch.equal(dequantize(q, scale), x)


def test_an_outlier_row_does_not_crush_another_row():
    small = torch.linspace(-1e-3, 1e-3, 64)
    x = torch.stack([small, small * 1e6])
    q, scale = quantize_rows(x)
    assert scale.shape == (2, 1)
    back = dequantize(q, scale)
    # the small row keeps its own relative precision, as if it were alone
    assert torch.allclose(back[0], small, rtol=HALF_STEP, atol=scale[0].item() * HALF_SUBNORMAL_STEP)
    assert (q[0].float() != 0).sum() >= 62


def test_fp8_linear_emulation_equals_a_hand_computation():
    # each row's and channel's largest value is 7 * 2**k, so its scale (amax / 448) is a power of two
    # and every value below is a 3-bit mantissa times a power of two: E4M3 holds them exactly, and
    # the quantised GEMM is the exact one, x @ w.T + bias, computed here by hand
    x = torch.tensor([[1.0, -2.0, 3.5, 0.5], [0.25, 0.0, -1.0, 1.75]])
    w = torch.tensor([[1.75, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.875], [-7.0, 0.0, 1.0, 2.0]])
    bias = torch.tensor([1.0, -1.0, 0.5])
    hand = torch.tensor([[1.75 - 2.0 - 0.5 + 1.0, 0.5 - 1.0 + 1.75 + 0.4375 - 1.0, -7.0 + 3.5 + 1.0 + 0.5],
                         [0.4375 - 1.75 + 1.0, 0.125 - 0.5 + 1.53125 - 1.0, -1.75 - 1.0 + 3.5 + 0.5]])
    out = fp8_linear(x, *quantize_weight(w), bias=bias)
    assert torch.equal(out, hand)


def test_fp8_linear_scales_each_sum_by_its_row_and_channel_scale():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 32, generator=g), torch.randn(16, 32, generator=g)
    xq, xs = quantize_rows(x)
    wq = quantize_weight(w)
    expected = dequantize(xq, xs).double() @ dequantize(wq.weight, wq.scale).double().t()
    assert torch.allclose(fp8_linear_reference(xq, xs, wq.weight, wq.scale, None).double(), expected,
                          rtol=1e-5, atol=1e-5)


def test_fp8_linear_keeps_leading_dims_and_rounds_to_the_output_dtype():
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    out = fp8_linear(x, *quantize_weight(torch.randn(16, 32)))
    assert out.shape == (2, 3, 16) and out.dtype == torch.bfloat16
    assert fp8_linear(x, *quantize_weight(torch.randn(16, 32)), out_dtype=torch.float32).dtype == torch.float32


def test_fp8_linear_is_close_to_the_fp32_gemm():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(64, 256, generator=g), torch.randn(128, 256, generator=g) / 16
    exact = x @ w.t()
    cosine = torch.nn.functional.cosine_similarity(fp8_linear(x, *quantize_weight(w)).flatten(), exact.flatten(), 0)
    assert cosine > 0.999


def test_fp8_stages_parse_a_comma_list():
    assert parse_fp8_stages("t3") == ("t3",)
    assert parse_fp8_stages(" t3, t3 ") == ("t3",)
    assert parse_fp8_stages("") == () and parse_fp8_stages(None) == ()


def test_fp8_for_the_flow_is_refused_as_not_implemented_yet():
    with pytest.raises(ValueError, match="flow stage is not implemented yet"):
        parse_fp8_stages("t3,flow")


def test_an_unknown_fp8_stage_is_refused_naming_the_known_one():
    with pytest.raises(ValueError, match="unknown fp8 stage 'vocoder'.*t3"):
        parse_fp8_stages("vocoder")
