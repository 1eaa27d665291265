"""The yardstick step (``chorus/bench/speed_of_light.py``) is T3's decode step, shape for shape
and number for number, with nothing around it."""
from __future__ import annotations

import pytest
import torch

from chorus.bench.speed_of_light import (
    ContiguousDecodeCache, DecodeShape, PlainDecodeModel, PlainDecodeStep, describe, time_decode_step,
)
from chorus.models.t3 import T3Model
from chorus.models.t3.runner import T3SingleSequence
from chorus.models.variants import VARIANTS, get_variant, tiny_variant
from tests.models.t3.weights import random_t3_state

DECODE_PARTS = ("tfmr.", "speech_emb.", "speech_pos_emb.", "speech_head.")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_plain_model_has_the_shapes_of_the_variants_decode_path(name):
    config = get_variant(name).t3
    with torch.device("meta"):
        plain, t3 = PlainDecodeModel(config), T3Model(config)
    t3_shapes = {k: v.shape for k, v in t3.state_dict().items() if k.startswith(DECODE_PARTS)}
    assert {k: v.shape for k, v in plain.state_dict().items()} == t3_shapes
    t3_count = sum(p.numel() for k, p in t3.named_parameters() if k.startswith(DECODE_PARTS))
    assert plain.num_parameters() == t3_count


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_a_built_plain_model_counts_as_many_parameters_as_the_loaded_t3(name):
    config = tiny_variant(name).t3
    t3 = T3Model.from_state_dict(config, random_t3_state(config))
    plain = PlainDecodeModel.build(config, dtype=torch.float32, device="cpu")
    backbone_and_head = sum(p.numel() for m in (t3.tfmr, t3.speech_head) for p in m.parameters())
    embeddings = sum(p.numel() for m in (t3.speech_emb, t3.speech_pos_emb) if m is not None for p in m.parameters())
    assert plain.num_parameters() == backbone_and_head + embeddings
    assert all(torch.isfinite(p).all() for p in plain.parameters())


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_the_plain_step_computes_t3s_next_logits(name):
    config = tiny_variant(name).t3
    torch.manual_seed(0)
    t3 = T3Model.from_state_dict(config, random_t3_state(config))
    plain = PlainDecodeModel.build(config, dtype=torch.float32, device="cpu")
    plain.load_state_dict({k: v for k, v in t3.state_dict().items() if k.startswith(DECODE_PARTS)})
    cond = torch.randn(1, 5, config.hidden_size)
    sequence = T3SingleSequence(t3, cond, torch.tensor([3, 4, 5, 6]), cfg=False, max_new_tokens=4)
    token = int(sequence.prefill()[0].argmax())
    expected = sequence.decode(token)  # [1, V]

    context = sequence.cache.length  # prefill + the fed token
    prompt = context - 1
    shape = DecodeShape(rows=1, context_tokens=context, speech_position=context - prompt)
    cache = ContiguousDecodeCache(plain, shape)
    cache.keys[:, :, :, :prompt] = sequence.cache.keys[:, :, :prompt].transpose(2, 3)
    cache.values[:, :, :, :prompt] = sequence.cache.values[:, :, :prompt].transpose(2, 3)
    with torch.inference_mode():
        logits = plain(torch.tensor([token]), torch.tensor([context - 1]), torch.tensor([shape.speech_position]), cache)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_a_step_feeds_its_argmax_back():
    plain = PlainDecodeModel.build(tiny_variant("turbo").t3, dtype=torch.float32, device="cpu")
    step = PlainDecodeStep(plain, DecodeShape(rows=3, context_tokens=12))
    with torch.inference_mode():
        expected = plain(step.tokens.clone(), step.positions, step.speech_positions, step.cache).argmax(-1)
    step()
    assert step.mode == "eager" and torch.equal(step.tokens, expected)


def test_timing_reports_a_positive_time_and_the_eager_mode_on_the_cpu():
    plain = PlainDecodeModel.build(tiny_variant("original").t3, dtype=torch.float32, device="cpu")
    ms, mode = time_decode_step(plain, DecodeShape(rows=2, context_tokens=40, speech_position=3),
                                steps=2, warmup_steps=1)
    assert ms > 0 and mode == "eager"
    info = describe(plain, mode)
    assert info["mode"] == "eager" and info["num_layers"] == 2 and info["parameters"] == plain.num_parameters()


def test_shapes_past_the_models_tables_are_refused():
    plain = PlainDecodeModel.build(tiny_variant("original").t3, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="speech position"):
        PlainDecodeStep(plain, DecodeShape(rows=1, context_tokens=10, speech_position=10**6))
    with pytest.raises(ValueError):
        DecodeShape(rows=0, context_tokens=10)
