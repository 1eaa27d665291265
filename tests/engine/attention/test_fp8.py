"""FP8 (e4m3) paged KV: quantise on write, dequantise on read, in the reference and (under the
Triton interpreter, which converts fp8 like the GPU: round to nearest even) in the kernels."""
import os

import pytest
import torch

from chorus.engine.attention import (
    dequantize_kv, paged_attention, paged_attention_reference, quantize_kv, triton_available, write_kv,
    write_kv_reference,
)
from tests.engine.attention.paged_batch import dense_attention, make_batch, rel_error, scenario

FP8 = torch.float8_e4m3fn
# e4m3 keeps 3 mantissa bits: a value's relative rounding error is at most 2^-4
FP8_HALF_STEP = 2.0 ** -4
interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or not triton_available(),
    reason="needs Triton and TRITON_INTERPRET=1 (set by tests/conftest.py when there is no GPU)")


def _fp8_batch(name: str, scales=(0.05, 0.02), **kw):
    """``make_batch`` with its pool re-stored as FP8 under (k_scale, v_scale)."""
    batch = make_batch(scenario(name, kw.pop("block_size", 16)), **kw)
    k_scale, v_scale = (torch.tensor([s], dtype=torch.float32) for s in scales)
    batch.key_cache = quantize_kv(batch.key_cache, k_scale, FP8)
    batch.value_cache = quantize_kv(batch.value_cache, v_scale, FP8)
    return batch, k_scale, v_scale


def test_round_trip_is_within_half_an_fp8_step():
    x = torch.randn(4096) * 3
    scale = torch.tensor([0.03])
    back = dequantize_kv(quantize_kv(x, scale, FP8), scale)
    normal = (x / scale).abs() >= 2.0 ** -6  # e4m3's smallest normal
    assert torch.all((back - x)[normal].abs() <= FP8_HALF_STEP * x[normal].abs() + 1e-7)


def test_quantize_saturates_instead_of_overflowing():
    scale = torch.tensor([0.5])
    stored = quantize_kv(torch.tensor([1e6, -1e6, 224.0]), scale, FP8)
    assert stored.float().tolist() == [448.0, -448.0, 448.0]


def test_non_fp8_caches_take_no_scale():
    cache = torch.zeros(2, 4, 1, 16)
    k = torch.randn(1, 1, 16)
    with pytest.raises(ValueError, match="FP8 caches only"):
        write_kv(cache, cache.clone(), k, k, torch.tensor([0]), k_scale=torch.ones(1), v_scale=torch.ones(1))
    with pytest.raises(ValueError, match="both"):
        write_kv(cache.to(FP8), cache.to(FP8), k, k, torch.tensor([0]), k_scale=torch.ones(1))


def test_write_kv_reference_stores_scaled_fp8_and_skips_negative_slots():
    batch = make_batch(scenario("mixed", 16))
    key_cache = torch.zeros_like(batch.key_cache, dtype=FP8)
    value_cache = torch.zeros_like(batch.value_cache, dtype=FP8)
    slots = batch.slot_mapping.clone()
    slots[::2] = -1
    k_scale, v_scale = torch.tensor([0.05]), torch.tensor([0.02])
    write_kv_reference(key_cache, value_cache, batch.new_k, batch.new_v, slots, k_scale, v_scale)
    keep = slots >= 0
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    assert torch.equal(flat_k[slots[keep]].view(torch.uint8),
                       quantize_kv(batch.new_k[keep], k_scale, FP8).view(torch.uint8))
    assert int(key_cache.float().count_nonzero()) == int(quantize_kv(batch.new_k[keep], k_scale, FP8).float().count_nonzero())


@pytest.mark.parametrize("name", ["decode", "mixed", "chunked"])
def test_reference_fp8_attention_is_close_to_full_precision(name):
    batch, k_scale, v_scale = _fp8_batch(name)
    out = paged_attention(*batch.args(), k_scale=k_scale, v_scale=v_scale, backend="torch")
    # the exact attention over what the pool holds, and the error FP8 adds to the true K/V
    assert rel_error(out, paged_attention_reference(
        batch.q, dequantize_kv(batch.key_cache, k_scale), dequantize_kv(batch.value_cache, v_scale),
        *batch.args()[3:])) < 1e-6
    assert rel_error(out, dense_attention(batch)) < 0.05


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scaled", [True, False])
def test_triton_write_kv_scales_saturates_and_skips_like_the_reference(dtype, scaled):
    """Slots, skipping, scaling and saturation. The inputs are FP8 values times power-of-two
    scales (plus saturating ones), so no rounding happens: Triton 3.6's interpreter rounds
    fp32 -> fp8 wrongly where the rounding carries into the exponent (1.95 -> 1.0), which the
    GPU does not; the GPU test checks the rounding (test_fp8_gpu.py)."""
    batch = make_batch(scenario("mixed", 8), heads=3, block_size=8)
    slots = batch.slot_mapping.clone()
    slots[1::3] = -1
    k_scale, v_scale = (torch.tensor([0.0625]), torch.tensor([0.5])) if scaled else (None, None)
    scales = dict(k_scale=k_scale, v_scale=v_scale) if scaled else {}
    new_k = dequantize_kv(quantize_kv(batch.new_k * 8, k_scale, FP8), k_scale)
    new_k[::5, 0, :4] = 1e5  # saturate at 448 * scale
    new_k[::5, 0, 4:8] = -1e5
    new_v = dequantize_kv(quantize_kv(batch.new_v, v_scale, FP8), v_scale)
    new_k, new_v = new_k.to(dtype), new_v.to(dtype)
    expected_k = torch.zeros_like(batch.key_cache, dtype=FP8)
    expected_v = torch.zeros_like(expected_k)
    write_kv(expected_k, expected_v, new_k, new_v, slots, backend="torch", **scales)
    key_cache, value_cache = torch.zeros_like(expected_k), torch.zeros_like(expected_v)
    write_kv(key_cache, value_cache, new_k, new_v, slots, backend="triton", **scales)
    assert torch.equal(key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), expected_v.view(torch.uint8))
    assert expected_k.float().abs().max() == 448.0


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("name", ["decode", "mixed"])
def test_triton_fp8_attention_matches_reference(name, num_splits):
    from chorus.engine.attention.triton_paged import paged_attention_triton

    batch, k_scale, v_scale = _fp8_batch(name, seed=num_splits)
    ref = paged_attention_reference(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    out = paged_attention_triton(*batch.args(), decode_tile=16, prefill_tile=16, num_splits=num_splits,
                                 max_query_len=batch.max_query_len, k_scale=k_scale, v_scale=v_scale)
    assert rel_error(out, ref) < 1e-5
