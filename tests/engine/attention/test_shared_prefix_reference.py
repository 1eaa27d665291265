"""The PyTorch path with a shared-prefix plan equals plain paged attention (only the float
summation order differs), for decode rows in groups, alone, padding, and prefill rows."""
import torch

from chorus.engine.attention import paged_attention, paged_attention_reference
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from tests.engine.attention.paged_batch import rel_error
from tests.engine.attention.shared_batch import make_shared_batch

BOUND = 1e-5


def _mixed_batch(**kw):
    # group 0: 3 rows, group 1: 2 rows, one row alone, one padding row, two prefill rows
    return make_shared_batch(
        [4, 2], [(0, 40), (1, 23), (-1, 30), (0, 33), (0, 57), (-1, 0), (1, 17)],
        prefills=[(20, 20), (45, 9)], **kw)


def test_plan_of_the_mixed_batch_has_two_groups():
    batch = _mixed_batch()
    shared = batch.shared()
    assert shared.max_groups == 2
    assert shared.prefix_len.tolist() == [32, 16, 0, 32, 32, 0, 16, 0, 0]


def test_decomposition_equals_plain_reference():
    batch = _mixed_batch()
    ref = paged_attention_reference(*batch.args())
    out = paged_attention(*batch.args(), num_decodes=batch.num_decodes, backend="torch",
                          shared_prefix=batch.shared())
    assert rel_error(out, ref) < BOUND, rel_error(out, ref)


def test_decomposition_over_an_fp8_pool_equals_the_scaled_plain_reference():
    batch = _mixed_batch(seed=4)
    k_scale, v_scale = batch.to_fp8(0.05, 0.02)
    ref = paged_attention_reference(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    out = paged_attention(*batch.args(), num_decodes=batch.num_decodes, backend="torch",
                          shared_prefix=batch.shared(), k_scale=k_scale, v_scale=v_scale)
    assert rel_error(out, ref) < BOUND, rel_error(out, ref)


def test_decomposition_with_spare_launch_groups_and_no_groups():
    batch = _mixed_batch(seed=3)
    ref = paged_attention_reference(*batch.args())
    for shared in (batch.shared(launch_groups=5), batch.shared(max_groups=0)):
        out = paged_attention(*batch.args(), num_decodes=batch.num_decodes, backend="torch",
                              shared_prefix=shared)
        assert rel_error(out, ref) < BOUND, rel_error(out, ref)


def test_decode_only_batch_and_untouched_rows_past_the_batch():
    batch = make_shared_batch([3], [(0, 30), (0, 26), (0, 41)], seed=1)
    out = torch.full((batch.q.shape[0] + 2, *batch.q.shape[1:]), 7.0)
    q = torch.cat([batch.q, torch.zeros(2, *batch.q.shape[1:])])
    args = (q, *batch.args()[1:])
    paged_attention(*args, num_decodes=3, backend="torch", shared_prefix=batch.shared(), out=out)
    ref = paged_attention_reference(*batch.args())
    assert rel_error(out[:3], ref) < BOUND and (out[3:] == 7.0).all()


def test_paged_kv_cache_attend_takes_the_plan_from_the_metadata():
    batch = _mixed_batch(seed=2)
    heads, head_dim = batch.q.shape[1:]
    cache = PagedKVCache(1, batch.key_cache.shape[0], batch.key_cache.shape[1], heads, head_dim,
                         dtype=torch.float32, device="cpu", backend="torch")
    cache.kv[0, 0], cache.kv[0, 1] = batch.key_cache, batch.value_cache
    no_write = torch.full((batch.q.shape[0],), -1, dtype=torch.int64)
    results = []
    for shared in (None, batch.shared()):
        cache.metadata = AttentionMetadata(
            slot_mapping=no_write, block_tables=batch.block_tables, seq_lens=batch.seq_lens,
            query_start_loc=batch.query_start_loc, max_query_len=20, max_seq_len=batch.max_seq_len,
            num_decodes=batch.num_decodes, shared_prefix=shared)
        results.append(cache.attend(0, batch.q, batch.q, batch.q))
    assert rel_error(results[1], results[0]) < BOUND
