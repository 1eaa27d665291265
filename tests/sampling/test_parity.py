"""Parity of process_logits with the reference: transformers' processors applied row by row in
the order chatterbox's T3.inference (EN/MTL) and T3.inference_turbo (Turbo/Nano) use."""
from __future__ import annotations

import inspect

import pytest
import torch

from chorus.models.variants import get_variant
from chorus.sampling import SamplingBatch, SamplingParams, penalty_mask_from_history, process_logits

pytestmark = pytest.mark.oracle

BOS = 6561
PROB_TOLERANCE = 1e-6


def _processors():
    from transformers.generation import logits_process as lp
    return lp


def reference_en_row(cond, uncond, history, p: SamplingParams):
    """One row through the EN/MTL loop body of T3.inference (CFG, penalty, T, min-p, top-p)."""
    lp = _processors()
    cond, uncond = cond[None], uncond[None]
    cfg = torch.as_tensor(p.cfg_weight, device=cond.device, dtype=cond.dtype)
    logits = cond + cfg * (cond - uncond)
    ids = torch.tensor([[BOS, *history]], dtype=torch.long, device=cond.device)
    logits = lp.RepetitionPenaltyLogitsProcessor(penalty=float(p.repetition_penalty))(ids, logits)
    if p.temperature != 1.0:
        logits = logits / p.temperature
    logits = lp.MinPLogitsWarper(min_p=p.min_p)(ids, logits)
    logits = lp.TopPLogitsWarper(top_p=p.top_p)(ids, logits)
    return logits[0]


def reference_turbo_row(logits, history, p: SamplingParams):
    """One row through T3.inference_turbo's processor list; ids are {BOS} on the first step."""
    lp = _processors()
    procs = lp.LogitsProcessorList()
    if p.temperature > 0 and p.temperature != 1.0:
        procs.append(lp.TemperatureLogitsWarper(p.temperature))
    if p.top_k > 0:
        procs.append(lp.TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        procs.append(lp.TopPLogitsWarper(p.top_p))
    if p.repetition_penalty != 1.0:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    ids = torch.tensor([list(history) if history else [BOS]], dtype=torch.long, device=logits.device)
    return procs(ids, logits[None])[0]


def _assert_same_distribution(ours, theirs):
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    err = (ours.softmax(-1) - theirs.softmax(-1)).abs().max().item()
    assert err <= PROB_TOLERANCE, err


def _en_rows():
    """(params overrides, history, logits tweak) per row, covering the edge cases."""
    g = torch.Generator().manual_seed(1)
    some = torch.randint(0, 6561, (40,), generator=g).tolist()
    repeated = some[:10] * 3 + [BOS + 1]
    return [
        (dict(), some),  # defaults
        (dict(top_p=1e-6, min_p=0.0, temperature=1.0), some),  # top-p tiny: one id left
        (dict(min_p=1.0), repeated),  # min-p at its maximum
        (dict(min_p=0.0, top_p=1.0, repetition_penalty=1.0, temperature=1.0, cfg_weight=0.0), some),
        (dict(top_p=0.5, temperature=1.5, repetition_penalty=2.0), repeated),
        (dict(cfg_weight=2.0, temperature=0.3, top_p=0.9, min_p=0.2), []),
        (dict(top_p=0.3, min_p=0.0, cfg_weight=0.0), []),  # ties at the top-p boundary (below)
        (dict(repetition_penalty=0.5, top_p=0.8), repeated),  # penalty < 1 boosts
    ]


def test_en_order_with_cfg_matches_reference(oracle):
    check_en_order_parity("cpu")


def check_en_order_parity(device: str) -> None:
    variant = get_variant("original")
    vocab = variant.t3.speech_vocab_size
    rows = _en_rows()
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([3.0, 3.0, 3.0, 3.0, 1.0, 0.7, 1.0, 1.5])[:, None]
    cond = torch.randn(len(rows), vocab, generator=g) * scale
    uncond = cond + torch.randn(len(rows), vocab, generator=g)
    cond[1, [3, 4000]] = cond[1].max() + 1.0  # tied maxima under a tiny top-p
    cond[2, [5, 77, 900]] = cond[2].max() + 1.0  # tied maxima under min_p = 1
    cond[6] = cond[6] * 0.1 - 10.0
    cond[6, 1000:1300] = 0.0  # a plateau of tied logits where the top-p cut falls
    uncond[[1, 2]] = cond[[1, 2]]  # keep those ties through the CFG combine
    cond, uncond = cond.to(device), uncond.to(device)
    params = [SamplingParams.for_variant(variant, seed=r, **o) for r, (o, _) in enumerate(rows)]
    histories = [h for _, h in rows]
    batch = SamplingBatch.build(params, variant, device)
    seen = penalty_mask_from_history(variant, histories, device)
    steps = torch.tensor([len(h) for h in histories], device=device)
    ours = process_logits(cond, batch, seen, steps, uncond_logits=uncond)
    for r, (p, h) in enumerate(zip(params, histories)):
        _assert_same_distribution(ours[r], reference_en_row(cond[r], uncond[r], h, p))


def _turbo_rows():
    g = torch.Generator().manual_seed(2)
    some = torch.randint(0, 6561, (40,), generator=g).tolist()
    repeated = some[:8] * 4 + [6562 - 1]
    return [
        (dict(), []),  # defaults, first step: the set is {BOS}
        (dict(), repeated),  # defaults, later step: generated tokens only
        (dict(top_k=5, top_p=1.0), some),  # ties at the top-k boundary (below)
        (dict(top_k=1), some),
        (dict(top_k=10_000, top_p=0.9), some),  # k above the vocabulary
        (dict(top_p=1e-6), some),
        (dict(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0), some),
        (dict(temperature=1.7, top_k=50, top_p=0.5, repetition_penalty=1.5), repeated),
        (dict(temperature=0.5, top_k=3, repetition_penalty=0.7), repeated),  # penalty on -inf ids
    ]


@pytest.mark.parametrize("name", ["turbo", "nano"])
def test_turbo_order_matches_reference(oracle, name):
    check_turbo_order_parity(name, "cpu")


def check_turbo_order_parity(name: str, device: str) -> None:
    variant = get_variant(name)
    vocab = variant.t3.speech_vocab_size
    rows = _turbo_rows()
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(len(rows), vocab, generator=g) * 3
    logits[2, [1, 2, 3]] = torch.tensor([20.0, 19.0, 18.0])
    logits[2, [10, 20, 30, 40]] = 15.0  # the 4th..7th largest tie across k = 5
    logits[5, [7, 8]] = logits[5].max() + 1.0  # tied maxima under a tiny top-p
    logits = logits.to(device)
    params = [SamplingParams.for_variant(variant, seed=r, **o) for r, (o, _) in enumerate(rows)]
    histories = [h for _, h in rows]
    batch = SamplingBatch.build(params, variant, device)
    seen = penalty_mask_from_history(variant, histories, device)
    steps = torch.tensor([len(h) for h in histories], device=device)
    ours = process_logits(logits, batch, seen, steps)
    assert torch.isfinite(ours[2]).sum() == 7  # every tie at the boundary stays
    for r, (p, h) in enumerate(zip(params, histories)):
        _assert_same_distribution(ours[r], reference_turbo_row(logits[r], h, p))


def test_reference_cfg_combine_is_the_one_we_implement(oracle):
    from chatterbox.models.t3.t3 import T3
    assert "logits = cond + cfg * (cond - uncond)" in inspect.getsource(T3.inference)


def _positions(source, needles):
    found = [source.find(n) for n in needles]
    assert all(i >= 0 for i in found), dict(zip(needles, found))
    return found


def test_en_order_matches_reference_loop(oracle):
    from chatterbox.models.t3.t3 import T3
    loop = inspect.getsource(T3.inference).split("Generation Loop")[1]
    needles = ["cond - uncond", "repetition_penalty_processor(ids", "/ temperature",
               "min_p_warper(ids", "top_p_warper(ids"]
    found = _positions(loop, needles)
    assert found == sorted(found)
    assert get_variant("original").sampling.order == ("cfg", "repetition_penalty", "temperature", "min_p", "top_p")
    assert get_variant("original").sampling.penalize_bos_always


def test_turbo_order_matches_reference_processor_list(oracle):
    from chatterbox.models.t3.t3 import T3
    source = inspect.getsource(T3.inference_turbo)
    found = _positions(source, ["TemperatureLogitsWarper(", "TopKLogitsWarper(", "TopPLogitsWarper(",
                                "RepetitionPenaltyLogitsProcessor("])
    assert found == sorted(found)
    sampling = get_variant("turbo").sampling
    assert sampling.order == ("temperature", "top_k", "top_p", "repetition_penalty")
    assert not sampling.penalize_bos_always


@pytest.mark.parametrize("name", ["original", "multilingual", "turbo"])
def test_penalty_sets_kept_across_steps_match_reference(oracle, name):
    """Several decode steps with incrementally kept penalty masks (record_sampled_tokens), each
    step compared with the reference given the full token history."""
    from chorus.sampling import initial_penalty_mask, record_sampled_tokens, sample_next_tokens
    variant = get_variant(name)
    vocab = variant.t3.speech_vocab_size
    turbo = not variant.t3.supports_cfg
    params = [SamplingParams.for_variant(variant, seed=7 + r, repetition_penalty=1.5 + r) for r in range(3)]
    batch = SamplingBatch.build(params, variant)
    seen = initial_penalty_mask(variant, len(params))
    histories: list[list[int]] = [[] for _ in params]
    g = torch.Generator().manual_seed(4)
    for step in range(6):
        steps = torch.full((len(params),), step)
        cond = torch.randn(len(params), vocab, generator=g)
        uncond = torch.randn(len(params), vocab, generator=g)
        if histories[0]:
            cond[:, histories[0][-1]] = -2.0  # the penalised id has a negative logit for row 0
        ours = process_logits(cond, batch, seen, steps, uncond_logits=None if turbo else uncond)
        for r, p in enumerate(params):
            theirs = (reference_turbo_row(cond[r], histories[r], p) if turbo
                      else reference_en_row(cond[r], uncond[r], histories[r], p))
            _assert_same_distribution(ours[r], theirs)
        tokens = sample_next_tokens(ours, batch, steps)
        record_sampled_tokens(variant, seen, tokens, steps)
        for r, t in enumerate(tokens.tolist()):
            histories[r].append(t)
