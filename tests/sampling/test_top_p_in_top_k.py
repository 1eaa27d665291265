"""Top-p over the top-k candidates (``apply_top_k_top_p``) against the full-vocabulary sort."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from chorus.models.variants import get_variant
from chorus.sampling import SamplingBatch, SamplingParams, penalty_mask_from_history, process_logits
from chorus.sampling.processors import FILTERED, apply_top_k, apply_top_k_top_p, apply_top_p

EN = get_variant("original")
TURBO = get_variant("turbo")


def top_p_stable_sort(logits, cutoff):
    """``apply_top_p`` with a stable sort: equal logits in increasing id order."""
    ascending, order = torch.sort(logits, descending=False, stable=True)
    drop_sorted = ascending.softmax(dim=-1).cumsum(dim=-1) <= cutoff
    drop_sorted[:, -1] = False
    return logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), FILTERED)


def random_case(g, device="cpu"):
    """Logits, per-row k, max_top_k and cutoffs with the edge cases mixed in: ties (bf16 values,
    half-integer plateaus), -inf entries, k above the vocabulary, rows with top-p off, k == 1."""
    rows, vocab = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(20, 3000, (1,), generator=g))
    logits = torch.randn(rows, vocab, generator=g) * float(torch.empty(1).uniform_(0.3, 5, generator=g))
    kind = int(torch.randint(0, 3, (1,), generator=g))
    if kind == 1:
        logits = logits.to(torch.bfloat16).float()
    elif kind == 2:
        logits = (logits * 2).round() / 2
    logits[0, torch.randint(0, vocab, (vocab // 4,), generator=g)] = FILTERED
    top_k = torch.randint(1, 300, (rows,), generator=g)
    top_k[torch.rand(rows, generator=g) < 0.15] = vocab + 5
    top_k[torch.rand(rows, generator=g) < 0.15] = 1
    top_p = torch.rand(rows, 1, generator=g).clamp(min=1e-6)
    cutoff = torch.where(torch.rand(rows, 1, generator=g) < 0.2, torch.tensor(-1.0), 1 - top_p)
    max_top_k = int(top_k.max()) + int(torch.randint(0, 4, (1,), generator=g))
    return logits.to(device), top_k.to(device), max_top_k, cutoff.to(device)


def test_equals_the_stable_full_sort_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits, top_k, max_top_k, cutoff = random_case(g)
        expected = top_p_stable_sort(apply_top_k(logits, top_k, max_top_k), cutoff)
        assert torch.equal(apply_top_k_top_p(logits, top_k, max_top_k, cutoff), expected)


def test_differs_from_the_unstable_sort_only_among_equal_logits():
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        logits, top_k, max_top_k, cutoff = random_case(g)
        expected = apply_top_p(apply_top_k(logits, top_k, max_top_k), cutoff)
        ours = apply_top_k_top_p(logits, top_k, max_top_k, cutoff)
        # the same kept values, and any id that differs has a twin of equal logit in its row
        assert torch.equal(ours.sort(dim=-1).values, expected.sort(dim=-1).values)
        for r, v in (torch.isneginf(ours) != torch.isneginf(expected)).nonzero().tolist():
            assert (logits[r] == logits[r, v]).sum() > 1


def test_rows_with_top_p_off_get_top_k_only():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 500, generator=g)
    top_k = torch.tensor([5, 600, 40])
    cutoff = torch.full((3, 1), -1.0)
    assert torch.equal(apply_top_k_top_p(logits, top_k, 600, cutoff), apply_top_k(logits, top_k, 600))


def test_rows_with_k_zero_and_top_p_off_pass_unchanged():
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(3))
    out = apply_top_k_top_p(logits, torch.tensor([0, 10]), 10, torch.tensor([[-1.0], [0.5]]))
    assert torch.equal(out[0], logits[0])


def test_rows_of_only_minus_inf_stay_so():
    logits = torch.full((1, 50), FILTERED)
    out = apply_top_k_top_p(logits, torch.tensor([5]), 5, torch.tensor([[0.1]]))
    assert torch.isneginf(out).all()


def _turbo(**overrides):
    return SamplingParams.for_variant(TURBO, **overrides)


@pytest.mark.parametrize("params, expected", [
    ([_turbo()], True),
    ([_turbo(), _turbo(temperature=0.0), _turbo(top_p=1.0, top_k=0)], True),  # greedy, all off
    ([_turbo(top_k=0, top_p=1.0), _turbo(top_k=10, top_p=1.0)], False),  # top-p off everywhere
    ([_turbo(top_k=0)], False),  # a row with top-p but no top-k
    ([_turbo(top_k=0, top_p=0.5), _turbo(top_k=5)], False),
    ([_turbo(top_k=0, top_p=1.0), _turbo(top_k=5)], True),
])
def test_the_flag_turbo(params, expected):
    assert SamplingBatch.build(params, TURBO).top_p_in_top_k is expected


def test_the_flag_is_off_without_top_k_in_the_order():
    assert not SamplingBatch.build([SamplingParams.for_variant(EN, top_p=0.8)], EN).top_p_in_top_k


def test_process_logits_is_the_same_with_and_without_the_flag():
    """Turbo's order end to end (temperature, top-k + top-p, penalty), many mixed batches."""
    g = torch.Generator().manual_seed(4)
    vocab = TURBO.t3.speech_vocab_size
    for trial in range(12):
        rows = 6
        params = []
        for r in range(rows):
            o = dict(seed=r, top_k=int(torch.randint(1, 1200, (1,), generator=g)),
                     top_p=float(torch.empty(1).uniform_(0.05, 1.0, generator=g)),
                     temperature=float(torch.empty(1).uniform_(0.3, 1.5, generator=g)),
                     min_new_tokens=int(torch.randint(0, 4, (1,), generator=g)))
            if r == 1:
                o.update(temperature=0.0)
            if r == 2:
                o.update(top_k=20_000)
            if r == 3:
                o.update(top_p=1.0)
            params.append(_turbo(**o))
        batch = SamplingBatch.build(params, TURBO)
        assert batch.top_p_in_top_k
        logits = torch.randn(rows, vocab, generator=g) * 3
        if trial % 2:
            logits = logits.to(torch.bfloat16).float()
        histories = [torch.randint(0, 6561, (int(torch.randint(0, 30, (1,), generator=g)),), generator=g).tolist()
                     for _ in range(rows)]
        seen = penalty_mask_from_history(TURBO, histories)
        steps = torch.tensor([len(h) for h in histories])
        ours = process_logits(logits, batch, seen, steps)
        full = process_logits(logits, dataclasses.replace(batch, top_p_in_top_k=False), seen, steps)
        assert torch.equal(ours.sort(dim=-1).values, full.sort(dim=-1).values)
        for r, v in (torch.isneginf(ours) != torch.isneginf(full)).nonzero().tolist():
            assert (logits[r] == logits[r, v]).sum() > 1  # only a choice among equal logits
        if trial % 2 == 0:  # fp32 normal logits: no ties near the cuts in practice
            assert torch.equal(ours, full)
