"""Sampler graphs on CUDA: replays give the eager sampler's tokens step after step, a steady step
needs no host sync, and the engine's tokens do not change with them."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.sampler_graphs import SamplerGraphs
from chorus.models.random_checkpoint import random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import get_variant, tiny_variant
from chorus.sampling import SamplingBatch, SamplingParams, initial_penalty_mask
from tests.engine.test_sampler_graphs import drive, mixed_params
from tests.engine.tiny_models import conditioning, voice

pytestmark = pytest.mark.gpu

EN = get_variant("original")
TURBO = get_variant("turbo")


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_graphed_sampling_equals_eager_step_after_step(variant):
    """38 steps with a finish, an arrival, a reordering, bucket changes and a pause; fp32 and
    bf16-rounded logits; greedy rows, seeds, min_new_tokens, CFG and non-CFG rows."""
    graphs = SamplerGraphs(variant, "cuda", max_rows=8)
    assert graphs.capture
    eager_tokens, eager_masks = drive(variant, "cuda", None)
    graph_tokens, graph_masks = drive(variant, "cuda", graphs)
    for rid in eager_tokens:
        assert graph_tokens[rid] == eager_tokens[rid], rid
        assert torch.equal(graph_masks[rid], eager_masks[rid]), rid
    assert graphs.captures == len(graphs.keys) >= 4


def test_a_steady_step_and_a_load_need_no_host_sync():
    params = mixed_params(TURBO)
    vocab = TURBO.t3.speech_vocab_size
    graphs = SamplerGraphs(TURBO, "cuda", max_rows=8)
    mask = initial_penalty_mask(TURBO, 1, "cuda")
    logits = torch.randn(4, vocab, device="cuda")

    def load(ids):
        graphs.load(SamplingBatch.build([params[r] for r in ids], TURBO), [mask] * len(ids), [3] * len(ids),
                    list(range(len(ids))), None)

    load("abcd")
    graphs.sample(logits)  # captures
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            graphs.sample(logits)
        load("bacd")  # the same key: replays the same graph
        graphs.sample(logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert graphs.captures == 1


def test_after_a_capture_breaks_mid_way_the_next_key_is_still_captured(monkeypatch):
    # a capture invalidated mid-way (e.g. by another thread's capture, before the gate ran one at a
    # time) left its pool marked as recording, and every later capture into it failed
    params = mixed_params(TURBO)
    graphs = SamplerGraphs(TURBO, "cuda", max_rows=8)
    mask = initial_penalty_mask(TURBO, 1, "cuda")
    logits = torch.randn(4, TURBO.t3.speech_vocab_size, device="cuda")
    static_step, broken = graphs._static_step, []

    def breaking_once(key):
        if not broken and torch.cuda.is_current_stream_capturing():
            broken.append(key)
            torch.cuda.synchronize()  # not allowed while capturing: the capture is invalidated
        return static_step(key)

    monkeypatch.setattr(graphs, "_static_step", breaking_once)
    for ids in ("abcd", "ab"):  # two row buckets: two keys
        graphs.load(SamplingBatch.build([params[r] for r in ids], TURBO), [mask] * len(ids), [3] * len(ids),
                    list(range(len(ids))), None)
        graphs.sample(logits[:len(ids)])  # the first capture breaks and samples eagerly
    assert len(broken) == 1 and graphs.captures == 1 and len(graphs.keys) == 1


def _tiny_cuda(name):
    variant = tiny_variant(name, layers=2, hidden=256, heads=4)
    state = random_state_dict(t3_key_specs(variant), 0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8  # sharp logits: EOS can occur
    return variant, T3Model.from_state_dict(variant.t3, state, dtype=torch.float32, device="cuda", source="random")


def _requests(variant, model):
    """Eight requests of different lengths and parameters, four running at a time (a CFG
    request takes two rows), so requests finish and join while others decode."""
    overrides = [dict(), dict(temperature=0.0), dict(min_new_tokens=10), dict(seed=2**64 - 1),
                 dict(repetition_penalty=1.0, temperature=1.3), dict(ignore_eos=True)]
    overrides += ([dict(cfg_weight=0.0), dict(top_p=0.7, min_p=0.0)] if variant.t3.supports_cfg
                  else [dict(top_k=0, top_p=0.9), dict(top_k=20, top_p=0.5)])
    g = torch.Generator().manual_seed(0)
    reqs = []
    for i, o in enumerate(overrides):
        text = torch.randint(1, 600, (int(torch.randint(4, 40, (1,), generator=g)),), generator=g).tolist()
        o = dict(dict(seed=100 + i, max_new_tokens=12 + 5 * i), **o)
        cond = conditioning(variant, model, voice(variant, i % 3))
        reqs.append(T3Request(text, cond, SamplingParams.for_variant(variant, **o)))
    return reqs


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_engine_tokens_are_the_same_with_and_without_sampler_graphs(name):
    variant, model = _tiny_cuda(name)
    reqs = _requests(variant, model)
    config = EngineConfig(variant=variant.name, default_deadline_s=None,
                          cache=CacheConfig(kv_cache_bytes=256 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=4 if name == "turbo" else 8,
                                                    max_num_batched_tokens=1024, max_model_len=1024))
    graphed = T3Engine(model, variant, config, sampler_graphs=True)
    eager = T3Engine(model, variant, config, sampler_graphs=False)
    assert graphed.runner.sampler_graphs is not None and eager.runner.sampler_graphs is None
    got = [r.tokens for r in graphed.generate(reqs)]
    want = [r.tokens for r in eager.generate(reqs)]
    assert got == want
    assert graphed.runner.sampler_graphs.captures > 0 and sum(map(len, want)) > 50


def test_an_engine_of_a_cfg_variant_is_built_holding_its_defaults_with_cfg_on_and_off():
    """Requests that set nothing, and those with CFG off (as a degrading server sets it), sample
    through graphs captured when the engine was built, not while it serves."""
    variant, model = _tiny_cuda("original")
    config = EngineConfig(variant=variant.name, default_deadline_s=None, cache=CacheConfig(kv_cache_bytes=256 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024))
    engine = T3Engine(model, variant, config)
    graphs = engine.runner.sampler_graphs
    assert {(key.rows, key.has_uncond) for key in graphs.keys} == \
        {(rows, uncond) for rows in (1, 2, 4, 8) for uncond in (False, True)}
    built_with = graphs.captures
    g = torch.Generator().manual_seed(1)
    reqs = [T3Request(torch.randint(1, 600, (12,), generator=g).tolist(),
                      conditioning(variant, model, voice(variant, i)),
                      SamplingParams.for_variant(variant, seed=i, max_new_tokens=8, cfg_weight=0.0))
            for i in range(3)]
    assert all(1 <= len(r.tokens) <= 8 for r in engine.generate(reqs))
    assert graphs.captures == built_with
