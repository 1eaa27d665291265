"""The T3 backbones with FP8 linears (``Backbone.use_fp8``) against fp32, on tiny models."""
import pytest
import torch

from chorus.models.t3 import T3Model
from chorus.models.variants import tiny_variant
from tests.models.t3.weights import random_t3_state

# on these tiny models (2 layers, hidden 64, seeded random weights) the worst position's logits
# cosine of the FP8 linears against fp32 measured 0.9968 (Llama) and 0.9980 (GPT-2) in fp32, 0.9965
# and 0.9982 in bf16 (bf16 without FP8: 0.99995); the bound leaves a margin for other CPUs' sums
MIN_COSINE_FP8_VS_FP32 = 0.99
VARIANTS = ("original", "turbo")  # a Llama and a GPT-2 backbone


def _model(name: str, dtype: torch.dtype) -> T3Model:
    config = tiny_variant(name).t3
    return T3Model.from_state_dict(config, random_t3_state(config), dtype=dtype)


def _logits(model: T3Model, embeds: torch.Tensor) -> torch.Tensor:
    """Speech logits of a prompt (one row) and of two decode steps after it, [L + 2, vocab] fp32."""
    cache = model.new_contiguous_cache(rows=1, max_len=embeds.shape[0] + 2)
    out = []
    for chunk in (embeds, embeds[:1], embeds[1:2]):
        positions = cache.begin_step(chunk.shape[0])
        out.append(model.speech_logits(model(chunk.to(model.dtype), positions, cache)).float())
        cache.end_step()
    return torch.cat(out)


def _embeds(model: T3Model) -> torch.Tensor:
    return torch.randn(12, model.config.hidden_size, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linears_give_logits_close_to_fp32(name, dtype):
    exact = _logits(_model(name, torch.float32), _embeds(_model(name, torch.float32)))
    model = _model(name, dtype)
    model.tfmr.use_fp8(True)
    cosine = torch.nn.functional.cosine_similarity(_logits(model, _embeds(model)), exact, dim=-1)
    assert cosine.min() > MIN_COSINE_FP8_VS_FP32


@pytest.mark.parametrize("name", VARIANTS)
def test_fp8_linears_change_the_logits(name):
    model = _model(name, torch.float32)
    plain = _logits(model, _embeds(model))
    model.tfmr.use_fp8(True)
    assert not torch.equal(_logits(model, _embeds(model)), plain)


@pytest.mark.parametrize("name", VARIANTS)
def test_fp8_off_again_gives_the_model_dtype_logits_bit_for_bit(name):
    model = _model(name, torch.bfloat16)
    plain = _logits(model, _embeds(model))
    model.tfmr.use_fp8(True)
    model.tfmr.use_fp8(False)
    assert torch.equal(_logits(model, _embeds(model)), plain)


@pytest.mark.parametrize("name", VARIANTS)
def test_fp8_linears_leave_the_state_dict_unchanged(name):
    model = _model(name, torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.tfmr.use_fp8(True)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
