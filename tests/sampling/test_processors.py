"""Behaviour of process_logits beyond reference parity (see test_parity.py)."""
from __future__ import annotations

import pytest
import torch

from chorus.models.variants import get_variant
from chorus.sampling import SamplingBatch, SamplingParams, penalty_mask_from_history, process_logits

EN = get_variant("original")
TURBO = get_variant("turbo")
EOS = 6562


def _logits(rows, vocab, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _run(variant, params, logits, histories=None, steps=None, uncond=None):
    histories = histories or [[1, 2, 3]] * len(params)
    steps = torch.tensor([len(h) for h in histories]) if steps is None else steps
    batch = SamplingBatch.build(params, variant)
    seen = penalty_mask_from_history(variant, histories)
    return process_logits(logits, batch, seen, steps, uncond_logits=uncond)


def test_rows_with_every_step_off_get_unprocessed_logits_en():
    off = dict(temperature=1.0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, cfg_weight=0.0)
    on = dict(temperature=0.7, top_p=0.5, min_p=0.1, repetition_penalty=1.3, cfg_weight=0.8)
    params = [SamplingParams.for_variant(EN, **off), SamplingParams.for_variant(EN, **on)]
    logits = _logits(2, 8194)
    logits[0, 50] = -500.0  # probability exactly 0 in fp32: still returned as is, not -inf
    uncond = _logits(2, 8194, seed=1)
    uncond[0] = float("nan")  # the row's CFG is off, so its placeholder never matters
    out = _run(EN, params, logits, uncond=uncond)
    assert torch.equal(out[0], logits[0])


def test_rows_with_every_step_off_get_unprocessed_logits_turbo():
    off = dict(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    params = [SamplingParams.for_variant(TURBO, **off), SamplingParams.for_variant(TURBO)]
    logits = _logits(2, 6563)
    out = _run(TURBO, params, logits)
    assert torch.equal(out[0], logits[0])
    assert torch.isneginf(out[1]).any()


def test_a_row_is_processed_the_same_alone_and_in_a_batch():
    params = [SamplingParams.for_variant(TURBO, top_k=k, top_p=p, temperature=t, seed=k)
              for k, p, t in [(5, 0.9, 0.7), (0, 0.5, 1.3), (1000, 1.0, 1.0), (50, 0.95, 0.0)]]
    histories = [[1, 2], [], [7, 7, 8], [9]]
    logits = _logits(4, 6563)
    together = _run(TURBO, params, logits, histories)
    for r in range(4):
        alone = _run(TURBO, params[r:r + 1], logits[r:r + 1], histories[r:r + 1])
        assert torch.equal(alone[0], together[r])


def test_cfg_weight_zero_ignores_the_unconditional_row():
    params = [SamplingParams.for_variant(EN, cfg_weight=0.0), SamplingParams.for_variant(EN, cfg_weight=0.5)]
    logits = _logits(2, 8194)
    uncond = _logits(2, 8194, seed=1)
    uncond[0] = float("inf")
    out = _run(EN, params, logits, uncond=uncond)
    ref = _run(EN, params[:1], logits[:1])  # no row uses CFG: no unconditional logits at all
    assert torch.equal(out[0], ref[0])


def test_cfg_combines_cond_and_uncond_per_row():
    params = [SamplingParams.for_variant(EN, cfg_weight=w, temperature=1.0, min_p=0.0, repetition_penalty=1.0)
              for w in (0.3, 1.5)]
    cond, uncond = _logits(2, 8194), _logits(2, 8194, seed=1)
    out = _run(EN, params, cond, uncond=uncond)
    weights = torch.tensor([[0.3], [1.5]])
    assert torch.equal(out, cond + weights * (cond - uncond))


def test_missing_unconditional_logits_is_an_error_when_cfg_is_used():
    with pytest.raises(ValueError, match="uncond_logits"):
        _run(EN, [SamplingParams.for_variant(EN)], _logits(1, 8194))


def test_greedy_rows_skip_temperature_and_filters_but_not_the_penalty():
    params = [SamplingParams.for_variant(TURBO, temperature=0.0, top_k=1, top_p=0.1, repetition_penalty=2.0)]
    logits = _logits(1, 6563)
    history = [int(logits[0].argmax())]
    out = _run(TURBO, params, logits, [history])
    expected = logits.clone()
    expected[0, history[0]] = expected[0, history[0]] / 2.0  # the top logit is positive
    assert torch.equal(out, expected)


def test_eos_is_banned_until_min_new_tokens():
    params = [SamplingParams.for_variant(TURBO, min_new_tokens=3, top_k=0, top_p=1.0)] * 2
    logits = _logits(2, 6563)
    out = _run(TURBO, params, logits, steps=torch.tensor([2, 3]))
    assert torch.isneginf(out[0, EOS]) and torch.isfinite(out[1, EOS])


def test_ignore_eos_bans_it_on_every_step():
    params = [SamplingParams.for_variant(EN, ignore_eos=True, cfg_weight=0.0)]
    out = _run(EN, params, _logits(1, 8194), steps=torch.tensor([999]))
    assert torch.isneginf(out[0, EOS])


def test_inputs_are_not_modified():
    params = [SamplingParams.for_variant(EN, min_new_tokens=5)]
    logits, uncond = _logits(1, 8194), _logits(1, 8194, seed=1)
    before = (logits.clone(), uncond.clone())
    _run(EN, params, logits, uncond=uncond)
    assert torch.equal(logits, before[0]) and torch.equal(uncond, before[1])
