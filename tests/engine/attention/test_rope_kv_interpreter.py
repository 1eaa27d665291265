"""The fused RoPE + K/V write kernel on the CPU under the Triton interpreter: the same bits as the
RoPE kernel followed by the write kernel, and close to the PyTorch references."""
import os

import pytest
import torch

from chorus.engine.attention import rope_write_kv, triton_available
from tests.engine.attention.rope_kv_batch import (
    FP8, LAYOUTS, assert_same_bits, bits, fused, make_rope_kv_batch, reference, two_step,
)

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1" or not triton_available(),
        reason="needs Triton and TRITON_INTERPRET=1 (set by tests/conftest.py when there is no GPU)",
    ),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # numpy, inside the interpreter
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 7])
def test_fused_kernel_equals_rope_then_write(layout, n):
    batch = make_rope_kv_batch(n, layout=layout, seed=n)
    assert_same_bits(fused(batch), two_step(batch))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fused_kernel_matches_the_references(layout):
    batch = make_rope_kv_batch(5, layout=layout, q_heads=3, kv_heads=3)  # 3 heads: a masked lane
    for got, want in zip(fused(batch), reference(batch)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_grouped_kv_heads():
    batch = make_rope_kv_batch(4, layout="views", q_heads=4, kv_heads=2, head_dim=32, block_size=8)
    assert_same_bits(fused(batch), two_step(batch))
    for got, want in zip(fused(batch), reference(batch)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bf16_equals_rope_then_write():
    # the interpreter's fp32 -> bf16 conversion truncates, so only the kernels are compared
    batch = make_rope_kv_batch(6, layout="views", dtype=torch.bfloat16)
    assert_same_bits(fused(batch), two_step(batch))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_pool_with_scales(layout):
    """Against the kernels only: the interpreter rounds fp32 -> fp8 wrongly where the rounding
    carries into the exponent (see test_fp8.py), so the quantised values are compared with the
    reference on the GPU (test_rope_kv_gpu.py)."""
    batch = make_rope_kv_batch(6, layout=layout, pool_dtype=FP8)
    got = fused(batch)
    assert_same_bits(got, two_step(batch))
    torch.testing.assert_close(got[0], reference(batch)[0], rtol=1e-6, atol=1e-6)


def test_slot_minus_one_skips_the_write_but_rotates_q():
    batch = make_rope_kv_batch(6, layout="separate", skip_every=2)
    q, key_cache, value_cache = fused(batch)
    ref_q, _, _ = reference(batch)
    torch.testing.assert_close(q, ref_q, rtol=1e-6, atol=1e-6)  # skipped tokens included
    written = batch.slot_mapping[batch.slot_mapping >= 0]
    for got, before in ((key_cache, batch.key_cache), (value_cache, batch.value_cache)):
        changed = (bits(got) != bits(before)).flatten(2).any(-1).flatten()  # per slot
        assert sorted(changed.nonzero().flatten().tolist()) == sorted(written.tolist())


def test_no_tokens():
    batch = make_rope_kv_batch(1, layout="separate")
    q = rope_write_kv(batch.q[:0], batch.k[:0], batch.v[:0], batch.cos[:0], batch.sin[:0],
                      *batch.caches(), batch.slot_mapping[:0], backend="triton")
    assert q.shape == (0, 4, 64)
