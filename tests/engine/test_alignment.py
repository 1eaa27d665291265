"""The engine's alignment side output: each sampled token's alignment row, from the step that
sampled it, equals what ``T3SingleSequence(alignment=True)`` (the exact path, itself compared with
the reference in tests/models/t3/test_alignment_parity.py) gives for the same tokens, whatever
else is in the batch, however the prefill is chunked and across preemptions."""
from __future__ import annotations

import asyncio
import functools

import pytest
import torch

from chorus.engine.async_engine import AsyncT3Engine
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.models.random_checkpoint import random_state_dict, t3_key_specs
from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.models.variants import tiny_variant
from chorus.sampling import SamplingParams
from chorus.t3_sequential import uses_cfg
from tests.engine.tiny_models import conditioning, tiny, voice

TOLERANCE = 1e-5


@functools.cache
def aligned_tiny(name: str):
    """A tiny model deep and wide enough to have every alignment head (14 layers, 16 heads)."""
    variant = tiny_variant(name, layers=14, hidden=64, heads=16)
    state = random_state_dict(t3_key_specs(variant), 0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8  # sharp logits: EOS can occur
    return variant, T3Model.from_state_dict(variant.t3, state, source="random")


def _engine(variant, model, *, budget=512, num_blocks=None, max_model_len=1024, async_scheduling=True,
            alignment=True):
    config = EngineConfig(
        variant=variant.name, default_deadline_s=None, alignment=alignment,
        cache=CacheConfig(block_size=16, num_blocks=num_blocks, kv_cache_bytes=64 << 20),
        scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=max_model_len,
                                  async_scheduling=async_scheduling),
    )
    return T3Engine(model, variant, config)


def _requests(variant, model, n, *, seed=0, max_tokens=12, want=lambda i: True, **overrides):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        text = torch.randint(1, 600, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
        params = SamplingParams.for_variant(variant, seed=100 + i, max_new_tokens=max_tokens,
                                            cfg_weight=[0.5, 0.0][i % 2], **overrides)
        out.append(T3Request(text, conditioning(variant, model, voice(variant, i)), params, want_alignment=want(i)))
    return out


def _exact_map(variant, model, request: T3Request, tokens: list[int]) -> torch.Tensor:
    """The alignment rows of ``tokens`` on the exact single-sequence path."""
    runner = T3SingleSequence(model, request.conditioning.embeds, torch.tensor(request.text_ids),
                              cfg=uses_cfg(variant, request.params.fitted_to(variant)),
                              max_new_tokens=len(tokens), alignment=True)
    runner.prefill()
    for token in tokens[:-1]:
        runner.decode(token)
    return runner.alignment_map


def _check(variant, model, requests, results) -> None:
    for request, result in zip(requests, results):
        assert result.tokens, result
        expected = _exact_map(variant, model, request, result.tokens)
        assert result.alignment.shape == expected.shape == (len(result.tokens), len(request.text_ids) + 2)
        assert float((result.alignment - expected).abs().max()) <= TOLERANCE, result.request_id


@pytest.mark.parametrize("name", ["original", "multilingual"])
def test_alignment_rows_equal_the_exact_path_in_a_mixed_batch(name):
    variant, model = aligned_tiny(name)
    requests = _requests(variant, model, 3)
    _check(variant, model, requests, _engine(variant, model, budget=48).generate(requests))  # chunked prefill


def test_alignment_rows_equal_the_exact_path_without_async_scheduling():
    variant, model = aligned_tiny("original")
    requests = _requests(variant, model, 2, seed=1)
    _check(variant, model, requests, _engine(variant, model, async_scheduling=False).generate(requests))


def test_preemption_neither_repeats_nor_loses_rows():
    variant, model = aligned_tiny("original")
    requests = _requests(variant, model, 4, seed=2, max_tokens=24, ignore_eos=True)
    engine = _engine(variant, model, num_blocks=14, max_model_len=128)  # too few blocks for all: preemption
    results = engine.generate(requests)
    assert engine.stats().num_preemptions > 0
    _check(variant, model, requests, results)


def test_only_the_requests_that_asked_get_rows():
    variant, model = aligned_tiny("original")
    requests = _requests(variant, model, 3, seed=3, want=lambda i: i != 1)
    results = _engine(variant, model).generate(requests)
    assert [r.alignment is not None for r in results] == [True, False, True]
    _check(variant, model, requests[::2], results[::2])


def test_alignment_is_refused_at_admission_for_gpt2_variants():
    variant, model = tiny("turbo")
    params = SamplingParams.for_variant(variant, seed=1, max_new_tokens=4)
    request = T3Request([1, 2, 3], conditioning(variant, model, voice(variant, 0)), params, want_alignment=True)
    engine = _engine(variant, model)
    with pytest.raises(ValueError, match="no alignment heads are known for the gpt2 T3 backbone"):
        engine.add_request(request)
    assert not engine.has_unfinished_requests()


def test_an_engine_built_without_alignment_refuses_a_request_that_asks():
    variant, model = aligned_tiny("original")
    params = SamplingParams.for_variant(variant, seed=1, max_new_tokens=4)
    request = T3Request([1, 2, 3], conditioning(variant, model, voice(variant, 0)), params, want_alignment=True)
    engine = _engine(variant, model, alignment=False)
    with pytest.raises(ValueError, match=r"EngineConfig\(alignment=True\)"):
        engine.add_request(request)
    assert not engine.has_unfinished_requests()


def test_streamed_rows_equal_the_whole_response():
    variant, model = aligned_tiny("multilingual")
    whole = _engine(variant, model).generate(_requests(variant, model, 2, seed=4))
    engine = AsyncT3Engine(_engine(variant, model)).start()
    try:
        async def run():
            return await asyncio.gather(*(engine.generate(r) for r in _requests(variant, model, 2, seed=4)))
        streamed = asyncio.run(run())
    finally:
        engine.stop()
    for a, b in zip(whole, streamed):
        assert a.tokens == b.tokens
        assert float((a.alignment - b.alignment).abs().max()) <= TOLERANCE


def test_rows_read_from_a_mixed_graphs_padded_layout_equal_the_exact_path():
    """What a mixed graph's replay leaves behind, on the CPU: the step computed in its bucket's
    padded layout (over stale buffers; padding embeddings NaN), the kept queries in that layout
    and ``last_logits_index`` pointing into it. Requests arrive while others decode."""
    from chorus.engine.cuda_graphs import MIXED_PROMPT_ROWS, MixedBucket
    from tests.engine.test_cuda_graphs import _padded_forward, _stale_buffers

    variant, model = aligned_tiny("original")
    engine = _engine(variant, model, budget=256)
    runner, original = engine.runner, engine.runner.forward_logits
    buffers = _stale_buffers(runner, tokens=512, rows=32, width=1024 // 16)
    padded_steps = []

    def forward_logits(inputs):
        meta = inputs.metadata
        if meta.max_query_len == 1 or meta.seq_lens.shape[0] - meta.num_decodes > MIXED_PROMPT_ROWS:
            return original(inputs)
        bucket = MixedBucket(decode_rows=meta.num_decodes + 3, prompt_tokens=inputs.num_tokens - meta.num_decodes + 5)
        logits = _padded_forward(runner, inputs, bucket, buffers)
        runner.last_logits_index = buffers.logits_index[:logits.shape[0]]
        padded_steps.append(meta.num_decodes)
        return logits

    runner.forward_logits = forward_logits
    requests = _requests(variant, model, 3, seed=5)
    waiting, ids, tokens, rows, steps = list(requests), [], {}, {}, 0
    while waiting or engine.has_unfinished_requests():
        if waiting and steps % 3 == 0:
            ids.append(engine.add_request(waiting.pop(0)))
        for event in engine.step():
            if event.new_token is not None:
                tokens.setdefault(event.request_id, []).append(event.new_token)
                rows.setdefault(event.request_id, []).append(event.alignment)
        steps += 1
    assert any(decodes > 0 for decodes in padded_steps)  # prompts admitted beside decode rows
    for request, request_id in zip(requests, ids):
        expected = _exact_map(variant, model, request, tokens[request_id])
        assert float((torch.stack(rows[request_id]) - expected).abs().max()) <= TOLERANCE
