"""The PyTorch paged path against dense causal attention on contiguous K/V."""
import subprocess
import sys

import pytest
import torch

from chorus.engine.attention import (
    paged_attention, paged_attention_reference, write_kv, write_kv_reference,
)
from tests.engine.attention.paged_batch import SCENARIOS, dense_attention, make_batch, rel_error, scenario


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("name", SCENARIOS)
def test_reference_matches_dense_attention(name, block_size):
    batch = make_batch(scenario(name, block_size), heads=3, block_size=block_size, seed=block_size)
    out = paged_attention_reference(*batch.args())
    assert rel_error(out, dense_attention(batch)) < 1e-6


def test_reference_handles_many_sequences_in_chunks(monkeypatch):
    import chorus.engine.attention.reference as reference

    batch = make_batch([(n, 1 + n % 3) for n in range(3, 60, 5)], heads=2, block_size=8)
    whole = paged_attention_reference(*batch.args())
    monkeypatch.setattr(reference, "_GATHER_BUDGET_ELEMENTS", 4000)  # forces many chunks
    chunked = paged_attention_reference(*batch.args())
    assert rel_error(chunked, whole) < 1e-6  # padding widths differ, so not bit-equal
    assert rel_error(chunked, dense_attention(batch)) < 1e-6


def test_decode_rows_are_not_padded_to_a_prefill_chunk(monkeypatch):
    import chorus.engine.attention.reference as reference

    chunks = []
    real = reference._attend_chunk

    def attend(q, kc, vc, tables, starts, lens, first, last, *rest):
        chunks.append([starts[s + 1] - starts[s] for s in range(first, last)])
        return real(q, kc, vc, tables, starts, lens, first, last, *rest)

    monkeypatch.setattr(reference, "_attend_chunk", attend)
    batch = make_batch([(40, 1), (33, 1), (57, 1), (64, 48)], heads=2, block_size=8)  # decode first
    out = paged_attention_reference(*batch.args())
    assert chunks == [[1, 1, 1], [48]]  # the three decode rows are not padded to 48 queries
    assert rel_error(out, dense_attention(batch)) < 1e-6


def test_padding_sequence_gets_zeros():
    batch = make_batch(scenario("padding_seq", 16))
    out = paged_attention_reference(*batch.args())
    starts = batch.query_start_loc.tolist()
    assert torch.count_nonzero(out[starts[1]:starts[2]]) == 0
    assert torch.count_nonzero(out[starts[3]:starts[4]]) == 0
    assert torch.isfinite(out).all()


def test_rows_past_the_last_sequence_are_left_alone():
    batch = make_batch(scenario("mixed", 16))
    n = batch.q.shape[0]
    q = torch.cat([batch.q, torch.randn(3, *batch.q.shape[1:])])
    out = torch.full_like(q, 7.0)
    paged_attention_reference(q, *batch.args()[1:], out=out)
    assert torch.all(out[n:] == 7.0)
    assert rel_error(out[:n], dense_attention(batch)) < 1e-6


def test_write_kv_stores_at_slots_and_skips_negative():
    batch = make_batch(scenario("mixed", 8), block_size=8)
    key_cache = torch.full_like(batch.key_cache, float("nan"))
    value_cache = torch.full_like(batch.value_cache, float("nan"))
    slots = batch.slot_mapping.clone()
    slots[::3] = -1
    write_kv_reference(key_cache, value_cache, batch.new_k, batch.new_v, slots)
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    kept = slots >= 0
    assert torch.equal(flat_k[slots[kept]], batch.new_k[kept])
    assert torch.equal(flat_v[slots[kept]], batch.new_v[kept])
    assert flat_k.isnan().all(dim=(1, 2)).sum() == flat_k.shape[0] - int(kept.sum())


def test_write_then_attend_equals_dense():
    """The pool filled only through write_kv (new tokens included) gives dense attention."""
    batch = make_batch(scenario("chunked", 16))
    key_cache = torch.randn_like(batch.key_cache)
    value_cache = torch.randn_like(batch.value_cache)
    for s, (k, v) in enumerate(zip(batch.dense_k, batch.dense_v)):
        table = batch.block_tables[s].long()
        pos = torch.arange(len(k))
        write_kv(key_cache, value_cache, k, v, table[pos // 16] * 16 + pos % 16)
    out = paged_attention(batch.q, key_cache, value_cache, *batch.args()[3:])
    assert rel_error(out, dense_attention(batch)) < 1e-6


def test_dispatch_on_cpu_uses_the_reference():
    batch = make_batch(scenario("mixed", 16))
    expected = paged_attention_reference(*batch.args())
    assert torch.equal(paged_attention(*batch.args()), expected)
    assert torch.equal(paged_attention(*batch.args(), backend="torch"), expected)
    with pytest.raises(ValueError, match="backend"):
        paged_attention(*batch.args(), backend="cuda")


def test_package_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, chorus.engine.attention as a\n"
        "assert not a.triton_available()\n"
        "try:\n"
        "    a.paged_attention(torch.zeros(1, 1, 16), torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 1, 16),\n"
        "                      torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),\n"
        "                      torch.tensor([0, 1], dtype=torch.int32), 1.0, backend='triton')\n"
        "except RuntimeError as exc:\n"
        "    assert 'Triton is not installed' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('forcing triton without it should fail')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
