"""The alignment rows on the GPU paths (paged Triton attention, queries rotated by the fused
rope kernel and kept inside the replayed CUDA graphs, decode and mixed) against the exact
contiguous path on the same device, full size, fp32."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.models.random_checkpoint import random_builtin_voice, random_state_dict, t3_key_specs
from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.models.variants import get_variant
from chorus.pipeline.conditioning import ConditioningCache
from chorus.sampling import SamplingParams
from chorus.voices import Voice

pytestmark = pytest.mark.gpu

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def setup():
    variant = get_variant("multilingual")
    state = random_state_dict(t3_key_specs(variant), seed=0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8
    model = T3Model.from_state_dict(variant.t3, state, dtype=torch.float32, device="cuda", source="random")
    voice = Voice.from_conditionals(random_builtin_voice(variant, 0))
    cond = ConditioningCache(model, variant).get(voice, 0.5)
    g = torch.Generator().manual_seed(0)
    requests = []
    for i in range(6):
        text = torch.randint(1, 600, (int(torch.randint(5, 60, (1,), generator=g)),), generator=g).tolist()
        params = SamplingParams.for_variant(variant, seed=i, max_new_tokens=24, cfg_weight=0.5)
        requests.append(T3Request(text, cond, params, want_alignment=i % 3 != 2))
    config = EngineConfig(variant=variant.name, default_deadline_s=None, alignment=True,
                          cache=CacheConfig(kv_cache_bytes=2 << 30),
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096,
                                                    max_model_len=1024))
    engine = T3Engine(model, variant, config, cuda_graphs=True)
    return variant, model, requests, engine


def test_gpu_alignment_rows_equal_the_exact_path(setup):
    variant, model, requests, engine = setup
    results = engine.generate(requests)
    assert engine.runner.graphs.replays["decode"] > 0
    for request, result in zip(requests, results):
        if not request.want_alignment:
            assert result.alignment is None
            continue
        runner = T3SingleSequence(model, request.conditioning.embeds, torch.tensor(request.text_ids), cfg=True,
                                  max_new_tokens=len(result.tokens), alignment=True)
        runner.prefill()
        for token in result.tokens[:-1]:
            runner.decode(token)
        expected = runner.alignment_map
        assert result.alignment.shape == expected.shape
        assert float((result.alignment - expected).abs().max()) <= TOLERANCE


def test_gpu_alignment_leaves_the_tokens_unchanged(setup):
    variant, model, requests, engine = setup
    with_rows = [r.tokens for r in engine.generate(requests)]
    plain = [T3Request(r.text_ids, r.conditioning, r.params) for r in requests]
    assert [r.tokens for r in engine.generate(plain)] == with_rows
