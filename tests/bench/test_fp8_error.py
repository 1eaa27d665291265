import torch

from chorus.bench.fp8_error import Fp8Error, teacher_forced_logits
from tests.engine.tiny_models import tiny


def _error(fp8_cosine: float, fp8_agreement: float) -> Fp8Error:
    return Fp8Error("bf16", cosine_low_vs_fp32=(0.9999, 0.9998), cosine_fp8_vs_fp32=(0.99, 0.99),
                    cosine_fp8_vs_low=(fp8_cosine, fp8_cosine), agreement_low_vs_fp32=0.9,
                    agreement_fp8_vs_low=fp8_agreement, agreement_fp8_vs_fp32=0.8)


def test_fp8_is_within_bf16_s_error_when_no_farther_from_bf16_than_bf16_from_fp32():
    assert _error(0.9999, 0.9).within_low_precision_error
    assert _error(0.9999, 0.9).as_dict()["within_bf16_error"] is True


def test_a_lower_cosine_or_a_lower_agreement_breaks_the_rule():
    assert not _error(0.9990, 1.0).within_low_precision_error
    assert not _error(1.0, 0.85).within_low_precision_error


def test_teacher_forcing_feeds_the_given_tokens_and_greedy_ones_otherwise():
    _, model = tiny("turbo")
    prompt = torch.randn(6, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    greedy_logits, greedy = teacher_forced_logits(model, prompt, steps=4)
    assert greedy_logits.shape == (5, model.config.speech_vocab_size) and greedy.shape == (4,)
    assert torch.equal(greedy, greedy_logits[:-1, : model.config.num_speech_codes].argmax(dim=-1))
    forced = torch.tensor([3, 1, 4, 1])
    logits, fed = teacher_forced_logits(model, prompt, steps=4, tokens=forced)
    assert torch.equal(fed, forced) and torch.equal(logits[0], greedy_logits[0])
    assert not torch.equal(logits[1:], greedy_logits[1:])
