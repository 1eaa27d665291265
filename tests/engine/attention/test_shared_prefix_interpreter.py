"""The shared-prefix Triton kernels against the PyTorch reference, under the Triton interpreter.

Tiny shapes (2 heads x 16, blocks of 8, tiles of 16) so prefixes and suffixes span several
tiles, groups span several query tiles, and split merging is exercised. fp32 only: the
interpreter's dots are exact there. FP8 pools are quantised by the PyTorch reference (the
interpreter's fp32 -> fp8 rounding is wrong in some cases, its fp8 loads are exact) with scales
that are not powers of two.
"""
import os

import pytest
import torch

from chorus.engine.attention import paged_attention_reference, triton_available
from tests.engine.attention.paged_batch import rel_error
from tests.engine.attention.shared_batch import make_shared_batch

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1" or not triton_available(),
        reason="needs Triton and TRITON_INTERPRET=1 (set by tests/conftest.py when there is no GPU)",
    ),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # numpy, inside the interpreter
]

BOUND = 1e-5


def _run(batch, shared, scales=None, **kw):
    from chorus.engine.attention.triton_paged import paged_attention_triton
    from chorus.engine.attention.triton_shared_prefix import shared_prefix_decode_triton

    kw.setdefault("block_g", 16)
    kw.setdefault("prefix_tile", 16)
    fp8 = {} if scales is None else dict(k_scale=scales[0], v_scale=scales[1])
    out = torch.full_like(batch.q, float("nan"))  # poisoned: every row must be written
    if batch.num_decodes < batch.seq_lens.shape[0]:  # prefill rows: the plain kernel, as usual
        paged_attention_triton(*batch.args(), num_decodes=0, max_query_len=64, out=out,
                               prefill_tile=16, **fp8)
    shared_prefix_decode_triton(*batch.args(), shared, num_decodes=batch.num_decodes,
                                max_seq_len=batch.max_seq_len, out=out, decode_tile=16, **fp8, **kw)
    return out


def _check(batch, shared, scales=None, **kw):
    fp8 = {} if scales is None else dict(k_scale=scales[0], v_scale=scales[1])
    ref = paged_attention_reference(*batch.args(), **fp8)
    out = _run(batch, shared, scales, **kw)
    rows = batch.query_start_loc[-1]
    assert rel_error(out[:rows], ref[:rows]) < BOUND, rel_error(out[:rows], ref[:rows])


def test_two_groups_a_loner_and_a_padding_row():
    batch = make_shared_batch([5, 2], [(0, 50), (1, 23), (-1, 30), (0, 41), (0, 77), (-1, 0),
                                       (1, 17)], seed=1)
    _check(batch, batch.shared())


def test_a_group_spanning_two_query_tiles():
    batch = make_shared_batch([3], [(0, 25 + (7 * i) % 20) for i in range(19)], seed=2)
    shared = batch.shared()
    assert shared.group_start[1] == 19  # 19 rows > BLOCK_G = 16
    _check(batch, shared)


@pytest.mark.parametrize("prefix_splits,num_splits", [(2, 1), (4, 2), (1, 4)])
def test_split_prefix_and_split_suffix_merge(prefix_splits, num_splits):
    batch = make_shared_batch([6], [(0, 60), (0, 53), (-1, 44), (0, 70)], seed=3)
    _check(batch, batch.shared(), prefix_splits=prefix_splits, num_splits=num_splits)


def test_spare_launch_groups_exit_and_prefill_rows_stay_plain():
    batch = make_shared_batch([2], [(0, 20), (0, 19)], prefills=[(20, 20), (30, 5)], seed=4)
    _check(batch, batch.shared(launch_groups=2))


def test_through_paged_attention_entry_point():
    from chorus.engine.attention import paged_attention

    batch = make_shared_batch([3], [(0, 30), (0, 26)], prefills=[(12, 12)], seed=5)
    ref = paged_attention_reference(*batch.args())
    out = paged_attention(*batch.args(), num_decodes=2, max_query_len=12, backend="triton",
                          max_seq_len=batch.max_seq_len, shared_prefix=batch.shared())
    assert rel_error(out, ref) < BOUND, rel_error(out, ref)


@pytest.mark.parametrize("prefix_splits,num_splits", [(1, 1), (2, 4)])
def test_fp8_pool_with_scales_matches_the_scaled_reference(prefix_splits, num_splits):
    batch = make_shared_batch([5, 2], [(0, 50), (1, 23), (-1, 30), (0, 41), (0, 77), (-1, 0), (1, 17)],
                              prefills=[(20, 20)], seed=6)
    scales = batch.to_fp8(0.05, 0.02)
    _check(batch, batch.shared(), scales, prefix_splits=prefix_splits, num_splits=num_splits)


def test_fp8_pool_through_paged_attention_matches_the_plain_fp8_kernels():
    from chorus.engine.attention import paged_attention

    batch = make_shared_batch([3], [(0, 30), (0, 26), (-1, 35), (0, 44)], prefills=[(12, 12)], seed=7)
    k_scale, v_scale = batch.to_fp8(0.03, 0.07)
    common = dict(num_decodes=batch.num_decodes, max_query_len=12, backend="triton",
                  max_seq_len=batch.max_seq_len, k_scale=k_scale, v_scale=v_scale)
    plain = paged_attention(*batch.args(), **common)
    out = paged_attention(*batch.args(), shared_prefix=batch.shared(), **common)
    assert rel_error(out, plain) < BOUND, rel_error(out, plain)
    ref = paged_attention_reference(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    assert rel_error(out, ref) < BOUND, rel_error(out, ref)
