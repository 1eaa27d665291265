"""The sampler's Triton kernel against its PyTorch reference (under the Triton interpreter on the
CPU): the same integer hash bit for bit, and the same tokens, greedy and exhausted rows included.

Under the interpreter the kernel's float64 log is numpy's, which can differ from torch's CPU log
in the last ulp, so the noise is compared to a few ulps here and bit for bit only on CUDA
(test_gpu.py), where both sides run the CUDA math library's ``log``.
"""
from __future__ import annotations

import os

import pytest
import torch

from chorus.models.variants import get_variant
from chorus.sampling import NO_TOKEN, SamplingBatch, SamplingParams, sample_next_tokens
from chorus.sampling.counter_rng import gumbel_noise, seed_lanes, split_seed, uniform_hash
from chorus.triton_backend import kernels_import

pytestmark = pytest.mark.skipif(
    not kernels_import("chorus.sampling.triton_sampler")
    or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (and TRITON_INTERPRET=1 without a GPU, set by tests/conftest.py)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TURBO = get_variant("turbo")
SEEDS = [0, 1, 2**32 - 1, 2**32, 2**63 + 5, 2**64 - 1]
STEPS = [0, 1, 2**31, 2**32 - 1, 2**32 + 17, 2**40 + 3]  # the hash takes the step's low 32 bits
VOCAB = 2500  # several vocabulary tiles (1024 tokens), the last one partial


def _lanes(seeds) -> torch.Tensor:
    return seed_lanes(torch.tensor([split_seed(s) for s in seeds], dtype=torch.int64)).to(DEVICE)


def _batch(temperatures, seeds=None):
    seeds = seeds or list(range(len(temperatures)))
    params = [SamplingParams.for_variant(TURBO, seed=s, temperature=t) for s, t in zip(seeds, temperatures)]
    return SamplingBatch.build(params, TURBO, DEVICE)


def _both(logits, batch, steps):
    """(reference tokens, kernel tokens) as lists."""
    logits, steps = logits.to(DEVICE), torch.as_tensor(steps, device=DEVICE)
    ref = sample_next_tokens(logits, batch, steps, backend="torch")
    out = sample_next_tokens(logits, batch, steps, backend="triton")
    assert out.dtype == torch.int64 and out.device == ref.device
    return ref.tolist(), out.tolist()


def test_kernel_hashes_equal_uniform_hash():
    from chorus.sampling.triton_sampler import uniform_hash_triton

    lanes, steps = _lanes(SEEDS), torch.tensor(STEPS, device=DEVICE)
    assert torch.equal(uniform_hash_triton(lanes, steps, VOCAB), uniform_hash(lanes, steps, VOCAB))


def test_kernel_hashes_read_strided_lanes_and_steps():
    """The sampler graphs pass the lanes and steps as column views of one packed int64 buffer."""
    from chorus.sampling.triton_sampler import uniform_hash_triton

    packed = torch.zeros(len(SEEDS), 8, dtype=torch.int64, device=DEVICE)
    packed[:, 3:5] = _lanes(SEEDS)
    packed[:, 5] = torch.tensor(STEPS)
    lanes, steps = packed[:, 3:5], packed[:, 5]
    assert torch.equal(uniform_hash_triton(lanes, steps, 300), uniform_hash(lanes, steps, 300))


def test_kernel_noise_equals_gumbel_noise_to_a_few_ulps():
    from chorus.sampling.triton_sampler import gumbel_noise_triton

    lanes, steps = _lanes(SEEDS[:3]), torch.tensor(STEPS[:3], device=DEVICE)
    torch.testing.assert_close(gumbel_noise_triton(lanes, steps, VOCAB), gumbel_noise(lanes, steps, VOCAB),
                               rtol=4e-16, atol=4e-15)


def test_sampled_greedy_and_exhausted_rows_match_the_reference():
    g = torch.Generator().manual_seed(0)
    temperatures = [0.8, 0.0, 1.0, 0.8, 0.0, 1.3, 0.8, 0.0]
    logits = torch.randn(len(temperatures), VOCAB, generator=g) * 3
    logits[0, torch.rand(VOCAB, generator=g) < 0.7] = float("-inf")  # a filtered row
    logits[2, :-3] = float("-inf")  # finite only in the last, partial tile
    logits[3] = float("-inf")  # exhausted, sampled
    logits[4] = float("-inf")  # exhausted, greedy
    logits[7, [5, 5 + 2048]] = 40.0  # greedy tie across tiles, in the same lane of a tile
    ref, out = _both(logits, _batch(temperatures), [0, 3, 7, 9, 2**32 + 1, 11, 12, 13])
    assert out == ref
    assert out[3] == out[4] == NO_TOKEN and out[7] == 5


def test_all_greedy_batches_take_the_first_argmax():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    logits[0, [7, 8, 2400]] = 9.0  # ties within and across tiles
    logits[1] = float("-inf")
    ref, out = _both(logits, _batch([0.0, 0.0, 0.0]), [0, 1, 2])
    assert out == ref == [7, NO_TOKEN, int(logits[2].argmax())]


def test_sampled_rows_break_score_ties_by_the_first_index():
    """+inf logits give equal (+inf) noisy scores: the first of them wins, as in torch.argmax."""
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    logits[:, [300, 300 + 2048]] = float("inf")  # the same lane of two tiles
    logits[1, [20, 1500]] = float("inf")
    ref, out = _both(logits, _batch([1.0, 1.0]), [4, 4])
    assert out == ref == [300, 20]


@pytest.mark.parametrize("vocab", [6563, 8194])
def test_tokens_match_the_reference_at_the_real_vocabulary_sizes(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4, vocab, generator=g) * 2
    logits[1, torch.rand(vocab, generator=g) < 0.99] = float("-inf")  # a narrow top-k / top-p row
    batch = _batch([0.8, 0.8, 0.0, 1.0], seeds=[3, 2**64 - 1, 5, 6])
    for step in (0, 1, 500):
        ref, out = _both(logits, batch, [step] * 4)
        assert out == ref


def test_a_batch_with_no_rows_returns_no_tokens():
    from chorus.sampling.triton_sampler import sample_triton

    empty = torch.empty(0, 10, device=DEVICE)
    lanes, steps = torch.empty(0, 2, dtype=torch.int64, device=DEVICE), torch.empty(0, dtype=torch.int64, device=DEVICE)
    out = sample_triton(empty, lanes, steps, torch.empty(0, dtype=torch.bool, device=DEVICE), False, NO_TOKEN)
    assert out.shape == (0,) and out.dtype == torch.int64
