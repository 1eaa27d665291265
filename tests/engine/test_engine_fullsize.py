"""Full-size engine parity on the CPU: a short batch per variant, token for token against the
single-sequence path (the tiny-model tests in test_engine_parity.py give the breadth)."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.models.random_checkpoint import random_builtin_voice, random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import get_variant
from chorus.sampling import SamplingParams
from chorus.t3_sequential import generate_speech_tokens
from chorus.pipeline.conditioning import ConditioningCache
from chorus.voices import Voice

pytestmark = pytest.mark.fullsize


@pytest.mark.parametrize("name", ["original", "multilingual", "turbo", "nano"])
def test_fullsize_batch_equals_sequential(name):
    variant = get_variant(name)
    state = random_state_dict(t3_key_specs(variant), seed=0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8
    model = T3Model.from_state_dict(variant.t3, state, dtype=torch.float32, device="cpu", source="random")
    del state
    voices = [Voice.from_conditionals(random_builtin_voice(variant, s)) for s in (0, 1)]
    cfgs = [0.5, 1.0] if variant.t3.supports_cfg else [None, None]
    cache = ConditioningCache(model, variant)
    requests = [
        T3Request(list(range(10, 10 + n)), cache.get(voices[i], [0.5, 0.8][i]), SamplingParams.for_variant(
            variant, seed=i, max_new_tokens=4, cfg_weight=cfgs[i]))
        for i, n in enumerate((6, 15))
    ]
    config = EngineConfig(variant=name, default_deadline_s=None, cache=CacheConfig(kv_cache_bytes=1 << 30),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024))
    results = T3Engine(model, variant, config).generate(requests)
    for req, res in zip(requests, results):
        expected = generate_speech_tokens(model, variant, req.conditioning.embeds, torch.tensor(req.text_ids), req.params).tokens
        assert res.tokens == expected and len(expected) == 4
