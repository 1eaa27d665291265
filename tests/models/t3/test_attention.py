import math

import pytest
import torch

from chorus.models.t3.attention import ContiguousKVCache, KVCacheFullError

HEADS, HEAD_DIM = 2, 8


def _qkv(rows: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, length, HEADS, HEAD_DIM, generator=g) for _ in range(3)]


def _causal_reference(q, k, v):
    """Plain softmax attention per row, [rows, T, H, d]."""
    scores = torch.einsum("rthd,rshd->rhts", q, k) / math.sqrt(HEAD_DIM)
    length = q.shape[1]
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("rhts,rshd->rthd", scores.softmax(-1), v)


def _run(cache: ContiguousKVCache, q, k, v, layer: int = 0):
    """Feed [rows, n, H, d] chunks through the flat interface; returns [rows, n, H, d]."""
    rows, n = q.shape[:2]
    cache.begin_step(n)
    out = cache.attend(layer, *(t.reshape(rows * n, HEADS, HEAD_DIM) for t in (q, k, v)))
    cache.end_step()
    return out.view(rows, n, HEADS, HEAD_DIM)


def _cache(rows: int = 2, max_len: int = 16, layers: int = 1) -> ContiguousKVCache:
    return ContiguousKVCache(layers, rows, max_len, HEADS, HEAD_DIM)


def test_prefill_then_decode_equals_full_causal_attention():
    q, k, v = _qkv(2, 7, seed=0)
    cache = _cache()
    outs = [_run(cache, q[:, :4], k[:, :4], v[:, :4])]
    for t in range(4, 7):
        outs.append(_run(cache, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1]))
    torch.testing.assert_close(torch.cat(outs, dim=1), _causal_reference(q, k, v), rtol=1e-5, atol=1e-6)


def test_chunk_after_cached_tokens_is_causal_with_offset():
    q, k, v = _qkv(2, 7, seed=1)
    cache = _cache()
    first = _run(cache, q[:, :3], k[:, :3], v[:, :3])
    second = _run(cache, q[:, 3:], k[:, 3:], v[:, 3:])
    torch.testing.assert_close(torch.cat([first, second], dim=1), _causal_reference(q, k, v), rtol=1e-5, atol=1e-6)


def test_rows_do_not_see_each_other():
    q, k, v = _qkv(2, 5, seed=2)
    base = _run(_cache(), q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[1] += 1.0
    v2[1] -= 2.0
    changed = _run(_cache(), q, k2, v2)
    assert torch.equal(base[0], changed[0])
    assert not torch.allclose(base[1], changed[1])


def test_layers_have_separate_storage():
    q, k, v = _qkv(1, 3, seed=3)
    cache = _cache(rows=1, layers=2)
    cache.begin_step(3)
    flat = [t.reshape(3, HEADS, HEAD_DIM) for t in (q, k, v)]
    cache.attend(0, *flat)
    cache.attend(1, flat[0], flat[1] * 2, flat[2] * 3)
    cache.end_step()
    assert torch.equal(cache.keys[0, 0, :3], k[0])
    assert torch.equal(cache.keys[1, 0, :3], 2 * k[0])
    assert torch.equal(cache.values[1, 0, :3], 3 * v[0])


def test_positions_are_row_major_and_continue_after_commit():
    cache = _cache(rows=2)
    assert cache.begin_step(3).tolist() == [0, 1, 2, 0, 1, 2]
    cache.end_step()
    assert cache.begin_step(1).tolist() == [3, 3]


def test_overflow_raises():
    cache = _cache(rows=1, max_len=4)
    cache.begin_step(3)
    cache.end_step()
    with pytest.raises(KVCacheFullError, match="holds 4 tokens"):
        cache.begin_step(2)


def test_buffers_use_requested_dtype_and_shape():
    cache = ContiguousKVCache(3, 2, 10, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    assert cache.keys.shape == (3, 2, 10, HEADS, HEAD_DIM)
    assert cache.values.dtype == torch.bfloat16
