"""Sampler graphs: buckets, keys, the LRU cap, and the static-buffer step against the eager
sampler (on the CPU the step runs uncaptured; test_sampler_graphs_gpu.py replays real graphs)."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.sampler_graphs import GraphKey, SamplerGraphs, row_bucket
from chorus.models.variants import Variant, get_variant
from chorus.sampling import (
    SamplingBatch, SamplingParams, initial_penalty_mask, process_logits, record_sampled_tokens, sample_next_tokens,
)
from tests.engine.test_engine_parity import _engine, _requests, _sequential
from tests.engine.tiny_models import tiny

EN = get_variant("original")
TURBO = get_variant("turbo")


# ------------------------------------------------------------------------------ a decode loop
def mixed_params(variant: Variant) -> dict[str, SamplingParams]:
    """Requests a..g: defaults, greedy, other filters, min_new_tokens / ignore_eos, seeds; g
    (joining last) makes Turbo's batch sort the vocabulary for top-p (top-p without top-k)."""
    def p(seed, **o):
        return SamplingParams.for_variant(variant, seed=seed, **o)

    if variant.t3.supports_cfg:
        return dict(a=p(1), b=p(2, temperature=0.0), c=p(3, cfg_weight=0.0, min_new_tokens=12),
                    d=p(4, top_p=0.8, cfg_weight=1.0), e=p(5, min_p=0.2, temperature=1.3, ignore_eos=True),
                    f=p(6, cfg_weight=0.0, repetition_penalty=1.0), g=p(2**64 - 1, top_p=0.5, min_p=0.0))
    return dict(a=p(1), b=p(2, temperature=0.0), c=p(3, top_k=50, top_p=0.5, min_new_tokens=12),
                d=p(4, top_p=1.0), e=p(5, top_k=0, top_p=1.0, temperature=1.2, ignore_eos=True),
                f=p(6, top_k=3, repetition_penalty=1.0), g=p(2**64 - 1, top_k=0, top_p=0.9))


# request ids sampled at each step, in row order: a finish, an arrival, a reordering, a bucket
# change (4 -> 8 -> 1), a request coming back after a pause (as after a preemption)
SCHEDULE = ([list("abcd")] * 8 + [list("acd")] * 6 + [list("acde")] * 6 + [list("daecf")] * 6
            + [list("f")] * 4 + [list("afg")] * 8)


def _layout(variant, params, ids):
    """Logits rows of a step: each request's conditional row, then its unconditional one (CFG)."""
    cond, uncond, n = [], [], 0
    for rid in ids:
        cond.append(n)
        uncond.append(n + 1 if variant.t3.supports_cfg and params[rid].cfg_weight > 0 else n)
        n = uncond[-1] + 1
    return cond, uncond, n


def drive(variant: Variant, device: str, graphs: SamplerGraphs | None, schedule=SCHEDULE, seed=0):
    """Tokens per request over ``schedule``, sampled eagerly (state rebuilt every step) or by
    ``graphs`` (state loaded on composition changes, masks handed back as the runner does).
    Also returns each request's final penalty mask."""
    params = mixed_params(variant)
    vocab = variant.t3.speech_vocab_size
    masks = {rid: initial_penalty_mask(variant, 1, device) for rid in params}
    tokens: dict[str, list[int]] = {rid: [] for rid in params}
    g = torch.Generator().manual_seed(seed)
    loaded: list[str] | None = None
    for step, ids in enumerate(schedule):
        cond_idx, uncond_idx, n = _layout(variant, params, ids)
        has_uncond = n > len(ids)
        logits = torch.randn(n, vocab, generator=g) * 3
        if step % 2:
            logits = logits.to(torch.bfloat16).float()  # ties, as bf16 heads give
        logits = logits.to(device)
        counts = [len(tokens[r]) for r in ids]
        if graphs is None:
            batch = SamplingBatch.build([params[r] for r in ids], variant, device)
            seen = torch.cat([masks[r] for r in ids])
            steps = torch.tensor(counts, device=device)
            uncond = logits[torch.tensor(uncond_idx, device=device)] if has_uncond else None
            processed = process_logits(logits[torch.tensor(cond_idx, device=device)], batch, seen, steps,
                                       uncond_logits=uncond)
            drawn = sample_next_tokens(processed, batch, steps)
            record_sampled_tokens(variant, seen, drawn, steps)
            for i, r in enumerate(ids):
                masks[r] = seen[i:i + 1]
        else:
            if ids != loaded:
                if loaded is not None:
                    back = graphs.seen.clone()
                    for i, r in enumerate(loaded):
                        masks[r] = back[i:i + 1]
                graphs.load(SamplingBatch.build([params[r] for r in ids], variant), [masks[r] for r in ids],
                            counts, cond_idx, uncond_idx if has_uncond else None)
                loaded = ids
            drawn = graphs.sample(logits)
        for r, t in zip(ids, drawn.tolist()):
            tokens[r].append(t)
    if graphs is not None:
        back = graphs.seen.clone()
        for i, r in enumerate(loaded):
            masks[r] = back[i:i + 1]
    return tokens, {r: m.cpu() for r, m in masks.items()}


# ------------------------------------------------------------------------------------ tests
def test_row_buckets_are_powers_of_two():
    assert [row_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]
    with pytest.raises(ValueError):
        row_bucket(0)


def test_the_key_is_the_bucket_and_the_host_side_signature():
    params = mixed_params(TURBO)
    batch = SamplingBatch.build([params["a"], params["b"], params["c"]], TURBO)
    key = GraphKey.of(batch, has_uncond=False)
    assert key == GraphKey(4, batch.active_steps, 1000, True, True, False, False, True)
    other_seeds = [SamplingParams.for_variant(TURBO, seed=s, temperature=t) for s, t in ((9, 0.5), (8, 1.5))]
    assert GraphKey.of(SamplingBatch.build(other_seeds + [params["c"]], TURBO), False) == GraphKey(
        4, key.active_steps, 1000, True, False, False, False, True)  # no greedy row any more
    assert GraphKey.of(SamplingBatch.build([params["a"]] * 4, TURBO), False).rows == 4
    assert GraphKey.of(SamplingBatch.build([params["a"]] * 5, TURBO), False).rows == 8
    assert not GraphKey.of(SamplingBatch.build([params["g"]], TURBO), False).top_p_in_top_k


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_the_static_buffer_step_gives_the_eager_tokens(variant):
    graphs = SamplerGraphs(variant, "cpu", max_rows=8)
    assert not graphs.capture
    eager_tokens, eager_masks = drive(variant, "cpu", None)
    graph_tokens, graph_masks = drive(variant, "cpu", graphs)
    assert graph_tokens == eager_tokens
    assert all(torch.equal(graph_masks[r], eager_masks[r]) for r in eager_masks)
    assert graphs.captures == len(graphs.keys) >= 4  # each key once; later uses replay


def test_the_graph_cap_drops_the_least_recently_used():
    params = mixed_params(TURBO)
    graphs = SamplerGraphs(TURBO, "cpu", max_rows=8, max_graphs=2)
    logits = torch.randn(8, TURBO.t3.speech_vocab_size)
    mask = initial_penalty_mask(TURBO, 1)

    def use(*ids):
        graphs.load(SamplingBatch.build([params[r] for r in ids], TURBO), [mask] * len(ids), [0] * len(ids),
                    list(range(len(ids))), None)
        graphs.sample(logits)
        return graphs.keys[-1]

    one, two = use("a"), use("a", "b")
    assert graphs.keys == [one, two] and graphs.captures == 2
    assert use("a") == one and graphs.keys == [two, one] and graphs.captures == 2
    three = use("a", "b", "c", "d", "e")
    assert graphs.keys == [one, three] and graphs.captures == 3
    use("b", "a")
    assert graphs.keys == [three, two] and graphs.captures == 4


def test_padded_rows_leave_the_real_rows_alone():
    """A composition shrinking inside its bucket leaves stale rows behind: they are reset."""
    params = mixed_params(TURBO)
    graphs = SamplerGraphs(TURBO, "cpu", max_rows=8)
    vocab = TURBO.t3.speech_vocab_size
    full = torch.ones(1, vocab, dtype=torch.bool)
    graphs.load(SamplingBatch.build([params[r] for r in "abcd"], TURBO), [full] * 4, [5] * 4, [0, 1, 2, 3], None)
    graphs.sample(torch.randn(4, vocab))
    ids = "ab"
    graphs.load(SamplingBatch.build([params[r] for r in ids], TURBO), [initial_penalty_mask(TURBO, 1)] * 2,
                [0, 0], [0, 1], None)
    logits = torch.randn(2, vocab)
    alone = SamplerGraphs(TURBO, "cpu", max_rows=2)
    alone.load(SamplingBatch.build([params[r] for r in ids], TURBO), [initial_penalty_mask(TURBO, 1)] * 2,
               [0, 0], [0, 1], None)
    assert torch.equal(graphs.sample(logits), alone.sample(logits))
    assert torch.equal(graphs.seen, alone.seen) and torch.equal(graphs.steps, alone.steps)


@pytest.mark.parametrize("variant", [EN, TURBO], ids=["original", "turbo"])
def test_warm_up_holds_a_step_per_bucket_that_a_default_composition_then_uses(variant):
    defaults = SamplingParams.for_variant(variant)
    graphs = SamplerGraphs(variant, "cpu", max_rows=20)
    has_uncond = variant.t3.supports_cfg
    assert graphs.warm_up(defaults, has_uncond) == 6
    assert [key.rows for key in graphs.keys] == [1, 2, 4, 8, 16, 32]
    assert graphs.warm_up(defaults, has_uncond) == 0  # held already
    rows = 11  # a composition of requests with their own seeds finds its graph
    batch = SamplingBatch.build([SamplingParams.for_variant(variant, seed=i) for i in range(rows)], variant)
    graphs.load(batch, [initial_penalty_mask(variant, 1)] * rows, [0] * rows, list(range(rows)),
                list(range(rows, 2 * rows)) if has_uncond else None)
    graphs.sample(torch.randn(2 * rows, variant.t3.speech_vocab_size))
    assert graphs.captures == 6


def test_warming_up_the_defaults_of_a_cfg_variant_also_holds_them_with_cfg_off():
    graphs = SamplerGraphs(EN, "cpu", max_rows=20)
    assert graphs.warm_up_defaults() == 12
    assert sorted((key.rows, key.has_uncond) for key in graphs.keys) == \
        sorted((rows, uncond) for rows in (1, 2, 4, 8, 16, 32) for uncond in (False, True))
    rows = 5  # requests that turned CFG off find their graph
    batch = SamplingBatch.build([SamplingParams.for_variant(EN, seed=i, cfg_weight=0.0) for i in range(rows)], EN)
    graphs.load(batch, [initial_penalty_mask(EN, 1)] * rows, [0] * rows, list(range(rows)), None)
    graphs.sample(torch.randn(rows, EN.t3.speech_vocab_size))
    assert graphs.captures == 12


def test_warming_up_the_defaults_of_a_variant_without_cfg_holds_one_step_per_bucket():
    graphs = SamplerGraphs(TURBO, "cpu", max_rows=20)
    assert graphs.warm_up_defaults() == 6
    assert not any(key.has_uncond for key in graphs.keys)


def test_a_composition_over_the_limit_does_not_fit():
    graphs = SamplerGraphs(TURBO, "cpu", max_rows=5)
    assert graphs.fits(5) and not graphs.fits(6) and not graphs.fits(0)


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_an_engine_sampling_through_the_static_buffers_equals_sequential(name):
    """The runner's integration (loads, hand-back, preemption) with the uncaptured step."""
    variant, model = tiny(name)
    reqs = _requests(variant, 6, seed=3, max_tokens=40, ignore_eos=True)
    reqs[1].params = SamplingParams.for_variant(variant, seed=77, temperature=0.0, max_new_tokens=25,
                                                ignore_eos=True)
    blocks, max_len = (24, 128) if name == "original" else (80, 512)
    engine = _engine(variant, model, num_blocks=blocks, max_model_len=max_len)
    engine.runner.sampler_graphs = SamplerGraphs(variant, "cpu", max_rows=4)  # 6 requests: some eager
    results = engine.generate(reqs)
    assert engine.scheduler.num_preemptions > 0 and engine.runner.sampler_graphs.captures > 0
    for req, res in zip(reqs, results):
        assert res.tokens == _sequential(variant, model, req)
