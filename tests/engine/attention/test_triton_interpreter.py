"""The Triton kernels against the PyTorch reference, on the CPU under the Triton interpreter.

Small shapes (2-3 heads, head_dim 64, tiles of 16/32 so contexts span several tiles). The
interpreter runs every program in numpy, so these prove indexing, masking, the online
softmax, split-KV merging and the launch plans, not speed. Deviations of the interpreter
from the GPU: fp32 dots are exact (no tf32), bf16 dots run in fp32 (see ``_dot_dtype``), and
its fp32 -> bf16 conversion truncates, hence the looser bf16 bound here than on the GPU.
"""
import os

import pytest
import torch

from chorus.engine.attention import (
    paged_attention, paged_attention_reference, triton_available, write_kv, write_kv_reference,
)
from tests.engine.attention.paged_batch import SCENARIOS, dense_attention, make_batch, rel_error, scenario

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1" or not triton_available(),
        reason="needs Triton and TRITON_INTERPRET=1 (set by tests/conftest.py when there is no GPU)",
    ),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # numpy, inside the interpreter
]

FP32_BOUND = 1e-5
LOW_PRECISION_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _triton(batch, **kw):
    from chorus.engine.attention.triton_paged import paged_attention_triton

    kw.setdefault("decode_tile", 16)
    kw.setdefault("prefill_tile", 16)
    return paged_attention_triton(*batch.args(), **kw)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("name", SCENARIOS)
def test_kernel_matches_reference(name, block_size):
    batch = make_batch(scenario(name, block_size), block_size=block_size, seed=block_size)
    ref = paged_attention_reference(*batch.args())
    out = _triton(batch)  # tiles of 16: contexts span several tiles and block tables
    assert rel_error(out, ref) < FP32_BOUND
    assert rel_error(out, dense_attention(batch)) < FP32_BOUND


@pytest.mark.parametrize("num_splits", [1, 2, 16])
@pytest.mark.parametrize("name", ["decode", "mixed"])
def test_split_kv_merges_to_the_same_result(name, num_splits):
    # 16 splits over at most 7 tiles of 16: many splits are empty and must count for nothing
    batch = make_batch(scenario(name, 16), seed=num_splits)
    ref = paged_attention_reference(*batch.args())
    out = _triton(batch, num_splits=num_splits, max_query_len=batch.max_query_len)
    assert rel_error(out, ref) < FP32_BOUND


@pytest.mark.parametrize("tile", [16, 32, 64])
def test_decode_kernel_tiles_smaller_and_larger_than_a_block(tile):
    batch = make_batch(scenario("decode", 32), block_size=32, seed=tile)
    ref = paged_attention_reference(*batch.args())
    out = _triton(batch, max_query_len=1, decode_tile=tile, prefill_tile=tile)
    assert rel_error(out, ref) < FP32_BOUND


def test_decode_rows_first_run_on_the_decode_kernel():
    specs = [(37, 1), (90, 1), (5, 1), (50, 17), (20, 20), (33, 1)]
    batch = make_batch(specs, seed=3)
    ref = paged_attention_reference(*batch.args())
    out = _triton(batch, max_query_len=20, num_decodes=3, num_splits=2)
    assert rel_error(out, ref) < FP32_BOUND


def test_query_blocks_of_64_rows():
    batch = make_batch([(150, 130), (70, 1), (80, 64)], seed=5)
    ref = paged_attention_reference(*batch.args())
    out = _triton(batch, max_query_len=130, prefill_tile=32)
    assert rel_error(out, ref) < FP32_BOUND


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["decode", "mixed"])
def test_low_precision(name, dtype):
    batch = make_batch(scenario(name, 16), dtype=dtype)
    out = _triton(batch, max_query_len=batch.max_query_len)
    assert out.dtype == dtype
    assert rel_error(out, paged_attention_reference(*batch.args())) < LOW_PRECISION_BOUND[dtype]


@pytest.mark.parametrize("num_splits", [1, 2])
def test_rows_past_the_last_sequence_are_not_written(num_splits):
    from chorus.engine.attention.triton_paged import paged_attention_triton

    batch = make_batch(scenario("mixed", 16))
    n = batch.q.shape[0]
    q = torch.cat([batch.q, torch.randn(5, *batch.q.shape[1:])])  # rows of a padded batch
    out = torch.full_like(q, 7.0)
    paged_attention_triton(q, *batch.args()[1:], out=out, prefill_tile=16, num_splits=num_splits)
    assert torch.all(out[n:] == 7.0)
    assert rel_error(out[:n], paged_attention_reference(*batch.args())) < FP32_BOUND


def test_padding_sequences_get_zeros_through_the_dispatcher():
    batch = make_batch(scenario("padding_seq", 16))
    out = paged_attention(*batch.args(), backend="triton", max_query_len=4)
    starts = batch.query_start_loc.tolist()
    assert torch.count_nonzero(out[starts[1]:starts[2]]) == 0
    assert torch.count_nonzero(out[starts[3]:starts[4]]) == 0
    assert rel_error(out, paged_attention_reference(*batch.args())) < FP32_BOUND


@pytest.mark.parametrize("heads", [2, 3])
def test_write_kv_matches_reference(heads):
    batch = make_batch(scenario("mixed", 8), heads=heads, block_size=8)
    slots = batch.slot_mapping.clone()
    slots[1::3] = -1
    # k and v as strided views of one fused [N, 3, H, D] projection output
    qkv = torch.stack([batch.q, batch.new_k, batch.new_v], dim=1)
    expected_k, expected_v = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv_reference(expected_k, expected_v, batch.new_k, batch.new_v, slots)
    key_cache, value_cache = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv(key_cache, value_cache, qkv[:, 1], qkv[:, 2], slots, backend="triton")
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)


def test_choose_num_splits():
    from chorus.engine.attention.launch_plan import choose_num_splits

    assert choose_num_splits(programs=8192, max_tiles=22, num_sms=132) == 1
    assert choose_num_splits(programs=16, max_tiles=22, num_sms=132) == 16
    assert choose_num_splits(programs=16, max_tiles=7, num_sms=132) == 4   # no empty split
    assert choose_num_splits(programs=128, max_tiles=22, num_sms=132) == 8
    assert choose_num_splits(programs=16, max_tiles=1, num_sms=132) == 1


def test_the_shared_prefix_kernels_do_not_import_the_plain_entry_module():
    """triton_paged imports triton_shared_prefix; the shared kernel code both use lives in
    triton_paged_kernel, so there is no import circle."""
    import subprocess
    import sys

    code = ("import sys; import chorus.engine.attention.triton_shared_prefix; "
            "print('chorus.engine.attention.triton_paged' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


_DECODES = [(37, 1), (1, 1), (17, 1)]
_PROMPTS = [(50, 17), (20, 20), (33, 2)]


@pytest.mark.parametrize("decodes, prompts, bucket, num_splits", [
    (_DECODES, _PROMPTS, (4, 64), None),
    (_DECODES, _PROMPTS, (8, 64), 4),
    (_DECODES, _PROMPTS, (3, 39), None),  # no decode padding
    ([], _PROMPTS, (0, 64), 2),  # nothing decoding (the first admission)
    (_DECODES, [(90, 70), (5, 5)], (4, 128), 8),
    (_DECODES, [(30, 9)] * 8, (4, 128), None),  # every prompt row of the bucket taken
    (_DECODES, [(16, 16)] * 4, (4, 64), None),  # prompts of whole query blocks
], ids=["padded", "padded-splits", "exact-decodes", "no-decodes", "long-prompt", "full-rows", "whole-blocks"])
def test_a_mixed_graphs_padded_layout_attends_as_the_step(decodes, prompts, bucket, num_splits):
    """A mixed step laid out in a CUDA-graph bucket (``cuda_graphs.lay_out_mixed``) and attended
    with the bucket's host-side bounds (its decode rows, a query-block size from its prompt
    positions, the engine's longest context) gives each real token the step's own attention;
    padding rows and positions are never read into them."""
    from types import SimpleNamespace

    from chorus.engine.attention.triton_paged import paged_attention_triton
    from chorus.engine.cuda_graphs import MixedBucket, StepBuffers, lay_out_mixed
    from chorus.engine.paged_cache import AttentionMetadata

    batch = make_batch(decodes + prompts, block_size=16, seed=len(prompts))
    tokens, heads, head_dim = batch.q.shape
    ref = paged_attention_reference(*batch.args())
    step = AttentionMetadata(slot_mapping=batch.slot_mapping, block_tables=batch.block_tables,
                             seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc,
                             max_query_len=batch.max_query_len, max_seq_len=int(batch.seq_lens.max()),
                             num_decodes=len(decodes))
    last = (batch.query_start_loc[1:] - 1).long()  # every row's last position asks for logits
    inputs = SimpleNamespace(embeds=batch.q.reshape(tokens, heads * head_dim), positions=torch.arange(tokens),
                             metadata=step, logits_index=last, num_tokens=tokens)
    bucket = MixedBucket(*bucket)
    buffers = StepBuffers.allocate(bucket.tokens, bucket.rows, batch.block_tables.shape[1], heads * head_dim,
                                   torch.float32, "cpu")
    buffers.embeds.normal_()  # padding positions hold whatever came before
    count = lay_out_mixed(inputs, bucket, buffers)
    meta = bucket.metadata(buffers, max_seq_len=1024)
    q = buffers.embeds[:bucket.tokens].view(bucket.tokens, heads, head_dim)
    out = torch.full_like(q, float("nan"))
    paged_attention_triton(q, batch.key_cache, batch.value_cache, meta.block_tables, meta.seq_lens,
                           meta.query_start_loc, batch.scale, max_query_len=meta.max_query_len,
                           num_decodes=meta.num_decodes, max_seq_len=meta.max_seq_len, out=out,
                           decode_tile=16, prefill_tile=16, num_splits=num_splits)
    real = torch.cat([out[:len(decodes)], out[bucket.decode_rows:bucket.decode_rows + tokens - len(decodes)]])
    assert rel_error(real, ref) < FP32_BOUND
    assert rel_error(out[buffers.logits_index[:count]], ref[last]) < FP32_BOUND
