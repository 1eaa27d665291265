"""The engine on an FP8 KV cache (CPU reference path, tiny random models): sizing, static
scales, end-to-end generation, and the accuracy measure."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine
from chorus.engine.kv_accuracy import measure_kv_accuracy
from chorus.engine.kv_quant import CALIBRATION_MARGIN, kv_scales, observe_kv_amax, synthetic_prompt
from tests.engine.test_engine_parity import _requests
from tests.engine.tiny_models import tiny

FP8 = torch.float8_e4m3fn


def _engine(variant, model, kv_cache_dtype: str, **cache):
    cache.setdefault("kv_cache_bytes", 8 << 20)
    config = EngineConfig(variant=variant.name, default_deadline_s=None,
                          cache=CacheConfig(block_size=16, kv_cache_dtype=kv_cache_dtype, **cache),
                          scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=512))
    return T3Engine(model, variant, config)


def test_the_pool_is_fp8_and_a_byte_budget_buys_blocks_by_its_element_size():
    variant, model = tiny("original")
    full, fp8 = _engine(variant, model, "auto"), _engine(variant, model, "fp8_e4m3")
    assert full.kv_cache.kv.dtype == model.dtype and fp8.kv_cache.kv.dtype == FP8
    ratio = torch.tensor([], dtype=model.dtype).element_size()  # fp32 on the CPU: 4x the blocks
    assert fp8.kv_cache.num_blocks == ratio * full.kv_cache.num_blocks
    assert fp8.kv_manager.pool.num_blocks == fp8.kv_cache.num_blocks


def test_the_engine_calibrates_static_scales_before_serving():
    variant, model = tiny("original")
    engine = _engine(variant, model, "fp8_e4m3")
    scales = engine.kv_cache.kv_scales
    assert torch.equal(scales, kv_scales(model, "calibrated"))
    amax = observe_kv_amax(model, synthetic_prompt(model))
    assert torch.all(torch.frexp(scales).mantissa == 0.5)  # powers of two
    ideal = amax * CALIBRATION_MARGIN / 448
    assert torch.all((ideal <= scales) & (scales < 2 * ideal))
    assert torch.equal(_engine(variant, model, "fp8_e4m3").kv_cache.kv_scales, scales)  # deterministic
    unit = T3Engine(model, variant, engine.config, kv_scale_rule="unit")
    assert torch.all(unit.kv_cache.kv_scales == 1)
    assert torch.all(_engine(variant, model, "auto").kv_cache.kv_scales == 1)  # unused without FP8


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_the_engine_generates_on_an_fp8_cache(name, capsys):
    """Same requests and seeds on both caches: FP8 tokens are valid and finish like the default
    cache's; how many agree is reported, not asserted (sampling amplifies tiny logit changes)."""
    variant, model = tiny(name)
    reqs = _requests(variant, 3, seed=4, max_tokens=12)
    base = _engine(variant, model, "auto").generate(reqs)
    fp8 = _engine(variant, model, "fp8_e4m3").generate(reqs)
    same = total = 0
    for b, f in zip(base, fp8):
        assert f.error is None and f.finish_reason is not None
        assert f.tokens and all(0 <= t < variant.t3.speech_vocab_size for t in f.tokens)
        assert len(f.tokens) <= 12
        agree = next((i for i, (x, y) in enumerate(zip(b.tokens, f.tokens)) if x != y), min(len(b.tokens), len(f.tokens)))
        same += agree
        total += len(b.tokens)
    with capsys.disabled():
        print(f"\n{name}: fp8 cache tokens equal to the default cache's before the first difference: {same}/{total}")


def test_the_accuracy_measure_is_exact_for_the_model_dtype():
    _, model = tiny("original")
    result = measure_kv_accuracy(model, kv_cache_dtype="auto", decode_steps=2)
    assert len(result.cosines) == 3 and result.min_cosine > 1 - 1e-6 and result.top1_agreement == 1.0


@pytest.mark.parametrize("rule", ["calibrated", "unit"])
def test_the_accuracy_measure_of_fp8_on_a_tiny_model(rule):
    variant, model = tiny("original")
    result = measure_kv_accuracy(model, scale_rule=rule, decode_steps=4)
    assert len(result.cosines) == 5
    assert 0.999 <= result.min_cosine < 1.0  # measured 0.9996 (both rules)
    assert result.as_dict()["scale_rule"] == rule


def test_power_of_two_at_least():
    from chorus.engine.kv_quant import power_of_two_at_least

    x = torch.tensor([0.0196, 0.03125, 1.0, 3.0, 448.0, 1e-6])
    assert power_of_two_at_least(x).tolist() == [0.03125, 0.03125, 1.0, 4.0, 512.0, 2.0 ** -19]


def test_an_unknown_scale_rule_is_rejected():
    _, model = tiny("original")
    with pytest.raises(ValueError, match="calibrated"):
        kv_scales(model, "dynamic")
