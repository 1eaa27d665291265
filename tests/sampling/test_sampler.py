"""The seeded exponential-race sampler."""
from __future__ import annotations

import pytest
import torch

from chorus.models.variants import get_variant
from chorus.sampling import NO_TOKEN, SamplingBatch, SamplingParams, sample_next_tokens
from tests.sampling.fake_decode import generate

EN = get_variant("original")
TURBO = get_variant("turbo")
CHI2_14_DOF_P1E4 = 42.58  # chi-square quantile 1 - 1e-4 with 14 degrees of freedom


def _draws(logits_row, seeds, steps):
    """One draw from the same logits per (seed, step) pair."""
    params = [SamplingParams.for_variant(TURBO, seed=s) for s in seeds]
    batch = SamplingBatch.build(params, TURBO)
    return sample_next_tokens(logits_row.expand(len(params), -1), batch, torch.as_tensor(steps))


N_DRAWS = 8_000
ACROSS_STEPS = {"seed 0, steps 0..n-1": ([0] * N_DRAWS, range(N_DRAWS)),
                "seed 2**64-1, steps 0..n-1": ([2**64 - 1] * N_DRAWS, range(N_DRAWS)),
                "seeds 0..n-1, step 0": (range(N_DRAWS), [0] * N_DRAWS)}


@pytest.mark.parametrize("case", ACROSS_STEPS)
def test_empirical_frequencies_match_the_probabilities(case):
    logits = torch.linspace(-2.0, 1.0, 16)
    logits[3] = float("-inf")
    seeds, steps = ACROSS_STEPS[case]
    n = N_DRAWS
    tokens = _draws(logits, list(seeds), list(steps))
    assert not (tokens == 3).any()
    counts = torch.bincount(tokens, minlength=16).double()
    expected = logits.double().softmax(-1) * n
    keep = expected > 0
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    assert chi2 < CHI2_14_DOF_P1E4, chi2


def test_greedy_rows_take_the_first_argmax():
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(0))
    logits[1, [10, 60]] = 9.0
    params = [SamplingParams.for_variant(TURBO, temperature=0.0, seed=s) for s in range(3)]
    tokens = sample_next_tokens(logits, SamplingBatch.build(params, TURBO), torch.tensor([0, 5, 9]))
    assert tokens.tolist() == logits.argmax(-1).tolist() and tokens[1] == 10


def test_greedy_and_sampling_rows_mix_in_one_batch():
    logits = torch.zeros(2, 1000)
    logits[:, 7] = 0.5  # nearly flat: a sampled row almost surely picks something else
    params = [SamplingParams.for_variant(TURBO, temperature=0.0), SamplingParams.for_variant(TURBO, seed=1)]
    tokens = sample_next_tokens(logits, SamplingBatch.build(params, TURBO), torch.tensor([0, 0]))
    assert tokens[0] == 7 and tokens[1] != 7


def test_rows_with_only_filtered_logits_return_no_token():
    logits = torch.randn(2, 50)
    logits[0] = float("-inf")
    params = [SamplingParams.for_variant(TURBO, seed=s) for s in range(2)]
    tokens = sample_next_tokens(logits, SamplingBatch.build(params, TURBO), torch.tensor([3, 3]))
    assert tokens[0] == NO_TOKEN and tokens[1] >= 0


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_a_request_samples_the_same_tokens_alone_and_in_a_batch(variant):
    mine = (1, SamplingParams.for_variant(variant, seed=42))
    others = [
        (2, SamplingParams.for_variant(variant, seed=7, temperature=1.3)),
        (3, SamplingParams.for_variant(variant, temperature=0.0)),
        (4, SamplingParams.for_variant(variant, seed=42, top_p=0.5)),  # same seed, other logits
    ]
    alone = generate(variant, [mine], [0], 12)[0]
    batched = generate(variant, [others[0], others[1], mine, others[2]], [5, 0, 0, 30], 12)[2]
    assert alone == batched


def test_different_seeds_give_different_sequences():
    requests = [(1, SamplingParams.for_variant(TURBO, seed=s)) for s in (1, 2)]
    first, second = generate(TURBO, requests, [0, 0], 12)
    assert first != second


def test_same_seed_repeats_exactly():
    requests = [(1, SamplingParams.for_variant(TURBO, seed=5))]
    assert generate(TURBO, requests, [0], 8) == generate(TURBO, requests, [0], 8)
