"""The Triton kernels against the PyTorch reference on a CUDA device, at serving shapes.

T3 shapes: 16 heads x 64, block size 16 (and 32), contexts up to ~1500, batches up to 256.
The reference runs on the same device in fp32 from the same (low-precision) inputs.
Bounds on ||out - ref|| / ||ref||: fp32 2e-5 (ieee dots; ex2.approx in the softmax), fp16 2e-3
and bf16 1e-2 (P is rounded to the input dtype before the P @ V dot; the output is rounded).
"""
import pytest
import torch

from chorus.engine.attention import (
    paged_attention, paged_attention_reference, triton_available, write_kv, write_kv_reference,
)
from tests.engine.attention.paged_batch import (
    SCENARIOS, advance_decode, capture_step_checking_no_sync, make_batch, rel_error, scenario,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(),
                       reason="needs CUDA and Triton"),
]

BOUND = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _serving_specs(kind: str, seed: int) -> list[tuple[int, int]]:
    gen = torch.Generator().manual_seed(seed)
    ctx = lambda n: torch.randint(300, 1500, (n,), generator=gen).tolist()  # noqa: E731
    if kind.startswith("decode"):
        return [(c, 1) for c in ctx(int(kind.split("_")[1]))]
    if kind == "mixed":  # decodes first, then a fresh 400-token prompt and a chunk after a prefix
        return [(c, 1) for c in ctx(60)] + [(400, 400), (800, 256), (37, 5)]
    if kind == "prefill":
        return [(400, 400), (420, 420), (16, 16), (1, 1)]
    raise ValueError(kind)


def _check(batch, dtype, **kw):
    ref = paged_attention_reference(*batch.args())
    out = torch.full_like(batch.q, float("nan"))  # poisoned: every row must be written
    paged_attention(*batch.args(), out=out, **kw)
    assert rel_error(out, ref) < BOUND[dtype], rel_error(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("name", SCENARIOS)
def test_small_scenarios(name, block_size, dtype):
    batch = make_batch(scenario(name, block_size), heads=16, block_size=block_size, dtype=dtype,
                       device="cuda", seed=block_size)
    _check(batch, dtype)                                   # max_query_len read on device
    _check(batch, dtype, max_query_len=batch.max_query_len)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["decode_1", "decode_8", "decode_64", "decode_256", "mixed", "prefill"])
def test_serving_shapes(kind, dtype):
    specs = _serving_specs(kind, seed=len(kind))
    batch = make_batch(specs, heads=16, dtype=dtype, device="cuda", table_slack=3)
    _check(batch, dtype, max_query_len=batch.max_query_len)
    if kind == "mixed":  # the 60 decode rows on the decode kernel, the rest on query blocks
        _check(batch, dtype, max_query_len=batch.max_query_len, num_decodes=60)


@pytest.mark.parametrize("num_splits", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("max_query_len", [1, 16])
def test_split_kv(num_splits, max_query_len):
    from chorus.engine.attention.triton_paged import paged_attention_triton

    specs = [(1400, 1), (900, 1)] if max_query_len == 1 else [(1400, 16), (900, 3)]
    batch = make_batch(specs, heads=16, dtype=torch.bfloat16, device="cuda")
    out = paged_attention_triton(*batch.args(), max_query_len=max_query_len, num_splits=num_splits)
    assert rel_error(out, paged_attention_reference(*batch.args())) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("heads", [16, 12])
def test_write_kv_is_exact_and_skips_padding(heads):
    batch = make_batch(scenario("mixed", 16), heads=heads, dtype=torch.bfloat16, device="cuda")
    slots = batch.slot_mapping.clone()
    slots[::2] = -1
    expected_k, expected_v = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv_reference(expected_k, expected_v, batch.new_k, batch.new_v, slots)
    key_cache, value_cache = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv(key_cache, value_cache, batch.new_k, batch.new_v, slots)
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)


def test_decode_step_has_no_host_sync_and_replays_in_a_cuda_graph():
    # no context ends on a block boundary, so the next token's slot is in an allocated block
    lens = [301, 398, 495, 593, 689, 786, 883, 1399]
    assert all(n % 16 for n in lens)
    specs = [(n, 1) for n in lens] + [(0, 1)] * 2  # two padding rows
    batch = make_batch(specs, heads=16, dtype=torch.bfloat16, device="cuda", table_slack=4)
    k_new, v_new = batch.new_k.clone(), batch.new_v.clone()
    slots, seq_lens = batch.slot_mapping.clone(), batch.seq_lens.clone()
    out = torch.empty_like(batch.q)
    bound = batch.block_tables.shape[1] * 16

    def step():
        write_kv(batch.key_cache, batch.value_cache, k_new, v_new, slots)
        paged_attention(batch.q, batch.key_cache, batch.value_cache, batch.block_tables, seq_lens,
                        batch.query_start_loc, batch.scale, max_query_len=1, max_seq_len=bound,
                        out=out)

    graph = capture_step_checking_no_sync(step)
    advance_decode(batch, slots, seq_lens, batch.q, k_new, v_new)
    expected_k, expected_v = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv_reference(expected_k, expected_v, k_new, v_new, slots)
    ref = paged_attention_reference(batch.q, expected_k, expected_v, batch.block_tables, seq_lens,
                                    batch.query_start_loc, batch.scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(batch.key_cache, expected_k)
    assert rel_error(out, ref) < BOUND[torch.bfloat16]
