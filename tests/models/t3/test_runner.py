import pytest
import torch

from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.models.variants import tiny_variant
from tests.models.t3.weights import random_t3_state


def _model(name: str, seed: int = 0) -> T3Model:
    config = tiny_variant(name).t3
    return T3Model.from_state_dict(config, random_t3_state(config, seed))


@pytest.fixture(scope="module")
def original():
    model = _model("original")
    g = torch.Generator().manual_seed(1)
    speaker, prompt = torch.randn(1, 256, generator=g), torch.randint(0, 6561, (1, 10), generator=g)
    cond = model.encode_conditioning(speaker, prompt, 0.5)
    return model, cond, torch.randint(1, 255, (7,), generator=g)


def test_cfg_rows_shapes(original):
    model, cond, text = original
    runner = T3SingleSequence(model, cond, text, cfg=True, max_new_tokens=3)
    assert runner.prefill().shape == (2, model.config.speech_vocab_size)
    assert runner.decode(17).shape == (2, model.config.speech_vocab_size)


def test_without_cfg_equals_conditional_row(original):
    model, cond, text = original
    pair = T3SingleSequence(model, cond, text, cfg=True, max_new_tokens=3)
    single = T3SingleSequence(model, cond, text, cfg=False, max_new_tokens=3)
    torch.testing.assert_close(single.prefill(), pair.prefill()[:1], rtol=0, atol=1e-5)
    for token in (5, 6000, 42):
        torch.testing.assert_close(single.decode(token), pair.decode(token)[:1], rtol=0, atol=1e-5)


def test_unconditional_row_differs(original):
    model, cond, text = original
    logits = T3SingleSequence(model, cond, text, cfg=True, max_new_tokens=1).prefill()
    assert float((logits[0] - logits[1]).abs().max()) > 1e-3


def test_fed_token_changes_next_logits(original):
    model, cond, text = original
    a = T3SingleSequence(model, cond, text, cfg=False, max_new_tokens=2)
    b = T3SingleSequence(model, cond, text, cfg=False, max_new_tokens=2)
    a.prefill(), b.prefill()
    assert not torch.allclose(a.decode(1), b.decode(2))


def test_decoding_past_max_new_tokens_raises(original):
    model, cond, text = original
    runner = T3SingleSequence(model, cond, text, cfg=False, max_new_tokens=1)
    runner.prefill()
    runner.decode(3)
    with pytest.raises(ValueError, match="max_new_tokens=1"):
        runner.decode(4)


def test_max_new_tokens_beyond_speech_positions_is_refused(original):
    model, cond, text = original
    with pytest.raises(ValueError, match="speech positions"):
        T3SingleSequence(model, cond, text, cfg=False, max_new_tokens=model.config.speech_pos_rows)


def test_gpt2_position_limit_is_enforced():
    model = _model("nano")
    cond = model.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, 100)), 0.0)
    with pytest.raises(ValueError, match="8196 positions"):
        T3SingleSequence(model, cond, torch.tensor([1, 2, 3]), cfg=False, max_new_tokens=8100)
