"""FP8 (e4m3) paged KV on a CUDA device: the Triton writer stores the reference's bytes (its
rounding included, which the interpreter cannot check), the kernels read FP8 pools as the
reference does, and the FP8 step stays free of host syncs and replays in a CUDA graph."""
import pytest
import torch

from chorus.engine.attention import (
    paged_attention, paged_attention_reference, quantize_kv, triton_available, write_kv,
)
from tests.engine.attention.paged_batch import (
    advance_decode, capture_step_checking_no_sync, dense_attention, make_batch, rel_error, scenario,
)
from tests.engine.attention.test_triton_gpu import _serving_specs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs CUDA and Triton"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="FP8 conversions need compute capability 8.9+"),
]

FP8 = torch.float8_e4m3fn
BF16_BOUND = 1e-2  # the bf16 kernels' bound against the fp32 reference (test_triton_gpu.py)


def _scales(k: float, v: float):
    return (torch.tensor([k], dtype=torch.float32, device="cuda"),
            torch.tensor([v], dtype=torch.float32, device="cuda"))


def _to_fp8(batch, k_scale, v_scale):
    batch.key_cache = quantize_kv(batch.key_cache, k_scale, FP8)
    batch.value_cache = quantize_kv(batch.value_cache, v_scale, FP8)
    return batch


@pytest.mark.parametrize("heads", [16, 12])
def test_write_kv_stores_the_reference_bytes(heads):
    batch = make_batch(scenario("mixed", 16), heads=heads, dtype=torch.bfloat16, device="cuda")
    k_scale, v_scale = _scales(0.0173, 0.0091)  # not powers of two: every value rounds
    slots = batch.slot_mapping.clone()
    slots[::3] = -1
    new_k = batch.new_k * 3
    new_k[::4, 0, :8] = 1e4  # saturates
    expected_k = torch.zeros(batch.key_cache.shape, dtype=FP8, device="cuda")
    expected_v = torch.zeros_like(expected_k)
    write_kv(expected_k, expected_v, new_k, batch.new_v, slots, k_scale=k_scale, v_scale=v_scale, backend="torch")
    key_cache, value_cache = torch.zeros_like(expected_k), torch.zeros_like(expected_v)
    write_kv(key_cache, value_cache, new_k, batch.new_v, slots, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), expected_v.view(torch.uint8))
    assert key_cache.float().abs().max() == 448.0


@pytest.mark.parametrize("kind", ["decode_1", "decode_64", "decode_256", "mixed", "prefill"])
def test_fp8_kernels_match_the_reference(kind):
    batch = make_batch(_serving_specs(kind, seed=len(kind)), heads=16, dtype=torch.bfloat16, device="cuda",
                       table_slack=3)
    k_scale, v_scale = _scales(0.011, 0.013)
    _to_fp8(batch, k_scale, v_scale)
    ref = paged_attention_reference(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(*batch.args(), out=out, max_query_len=batch.max_query_len, k_scale=k_scale, v_scale=v_scale)
    assert rel_error(out, ref) < BF16_BOUND, rel_error(out, ref)
    if kind == "mixed":
        paged_attention(*batch.args(), out=out, max_query_len=batch.max_query_len, num_decodes=60,
                        k_scale=k_scale, v_scale=v_scale)
        assert rel_error(out, ref) < BF16_BOUND


@pytest.mark.parametrize("num_splits", [1, 4, 16])
def test_fp8_split_kv(num_splits):
    from chorus.engine.attention.triton_paged import paged_attention_triton

    batch = _to_fp8(make_batch([(1400, 1), (900, 1)], heads=16, dtype=torch.bfloat16, device="cuda"),
                    *_scales(0.02, 0.02))
    k_scale, v_scale = _scales(0.02, 0.02)
    out = paged_attention_triton(*batch.args(), max_query_len=1, num_splits=num_splits,
                                 k_scale=k_scale, v_scale=v_scale)
    ref = paged_attention_reference(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    assert rel_error(out, ref) < BF16_BOUND


def test_fp8_attention_error_against_exact_attention():
    """What FP8 storage costs one attention call at serving shapes (random N(0,1) K/V, scales
    from amax / 448 x 2): bf16 storage is the yardstick."""
    specs = _serving_specs("decode_64", seed=3)
    exact = dense_attention(make_batch(specs, heads=16, dtype=torch.float32, device="cuda"))
    bf16 = make_batch(specs, heads=16, dtype=torch.bfloat16, device="cuda")
    bf16_error = rel_error(paged_attention(*bf16.args()), exact)
    k_scale, v_scale = _scales(float(bf16.key_cache.float().abs().max()) * 2 / 448,
                               float(bf16.value_cache.float().abs().max()) * 2 / 448)
    fp8 = _to_fp8(bf16, k_scale, v_scale)
    fp8_error = rel_error(paged_attention(*fp8.args(), k_scale=k_scale, v_scale=v_scale), exact)
    print(f"attention rel. error vs exact: bf16 cache {bf16_error:.2e}, fp8 cache {fp8_error:.2e}")
    # the PyTorch reference on these inputs: bf16 3.4e-3, fp8 3.9e-2 (e4m3's 3 mantissa bits)
    assert bf16_error < BF16_BOUND and fp8_error < 0.06


def test_fp8_decode_step_has_no_host_sync_and_replays_in_a_cuda_graph():
    lens = [301, 398, 495, 593, 689, 786, 883, 1399]
    specs = [(n, 1) for n in lens] + [(0, 1)] * 2
    batch = make_batch(specs, heads=16, dtype=torch.bfloat16, device="cuda", table_slack=4)
    k_scale, v_scale = _scales(0.015, 0.012)
    _to_fp8(batch, k_scale, v_scale)
    k_new, v_new = batch.new_k.clone(), batch.new_v.clone()
    slots, seq_lens = batch.slot_mapping.clone(), batch.seq_lens.clone()
    out = torch.empty_like(batch.q)
    bound = batch.block_tables.shape[1] * 16

    def step():
        write_kv(batch.key_cache, batch.value_cache, k_new, v_new, slots, k_scale=k_scale, v_scale=v_scale)
        paged_attention(batch.q, batch.key_cache, batch.value_cache, batch.block_tables, seq_lens,
                        batch.query_start_loc, batch.scale, max_query_len=1, max_seq_len=bound, out=out,
                        k_scale=k_scale, v_scale=v_scale)

    graph = capture_step_checking_no_sync(step)
    advance_decode(batch, slots, seq_lens, batch.q, k_new, v_new)
    k_scale.fill_(0.02)  # scales are read on the device at replay (the engine never changes them)
    expected_k, expected_v = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv(expected_k, expected_v, k_new, v_new, slots, k_scale=k_scale, v_scale=v_scale, backend="torch")
    ref = paged_attention_reference(batch.q, expected_k, expected_v, batch.block_tables, seq_lens,
                                    batch.query_start_loc, batch.scale, k_scale=k_scale, v_scale=v_scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(batch.key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert rel_error(out, ref) < BF16_BOUND
