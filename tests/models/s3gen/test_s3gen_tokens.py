"""The variant's token clean-up before S3Gen and the resulting audio lengths (no models needed)."""
from __future__ import annotations

import logging

import pytest
import torch

from chorus.models.s3gen.s3gen import (
    SILENCE_TOKEN, TokenRules, item_generators, output_num_samples, postprocess_speech_tokens,
)
from chorus.models.variants import get_variant

BOS, EOS = 6561, 6562


def test_original_keeps_the_span_between_bos_and_eos_then_real_codes():
    original = get_variant("original")
    assert postprocess_speech_tokens([1, 2, BOS, 3, 7000, 4, EOS, 5], original) == [3, 4]
    assert postprocess_speech_tokens([1, 2, 3], original) == [1, 2, 3]
    assert postprocess_speech_tokens([EOS, 1, 2], original) == []
    assert postprocess_speech_tokens(torch.tensor([[8, 9, 6563]]), original) == [8, 9]


def test_two_bos_cut_after_the_first_where_the_reference_raises():
    assert postprocess_speech_tokens([1, BOS, 2, BOS, 3], get_variant("original")) == [2, 3]


def test_multilingual_drops_ids_s3gen_cannot_vocode_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert postprocess_speech_tokens([BOS, 1, 7000, 2, EOS], get_variant("multilingual")) == [1, 2]
    assert "dropped 1 speech token" in caplog.text


@pytest.mark.parametrize("name", ["turbo", "nano"])
def test_turbo_and_nano_filter_without_cutting_and_append_three_silences(name):
    variant = get_variant(name)
    assert postprocess_speech_tokens([1, BOS, 2, 3], variant) == [1, 2, 3] + [SILENCE_TOKEN] * 3
    assert postprocess_speech_tokens([], variant) == [SILENCE_TOKEN] * 3


def test_rules_come_from_the_variant_registry():
    rules = {name: TokenRules.for_variant(get_variant(name)) for name in ("original", "multilingual", "turbo")}
    assert rules["original"].cut_at_markers and rules["multilingual"].cut_at_markers
    assert not rules["turbo"].cut_at_markers and rules["turbo"].silence_tokens == 3
    assert rules["multilingual"].drop_last_token_audio and not rules["original"].drop_last_token_audio


def test_output_lengths():
    original, mtl = get_variant("original"), get_variant("multilingual")
    assert output_num_samples(10, 500, 250, original) == 9600
    assert output_num_samples(10, 499, 249, original) == 9600 - 480  # odd prompt mel: one frame less
    assert output_num_samples(10, 500, 250, mtl) == 9 * 960
    assert output_num_samples(1, 500, 250, mtl) == 960  # max(1, N - 1) tokens
    assert output_num_samples(0, 500, 250, original) == 0


def test_item_generators_share_one_stream_on_the_cpu():
    main, phases = item_generators(3, "cpu")
    assert main is phases
    assert torch.equal(torch.rand(4, generator=main), torch.rand(4, generator=torch.Generator().manual_seed(3)))


def test_original_says_why_fewer_tokens_are_vocoded(caplog):
    with caplog.at_level(logging.WARNING):
        assert postprocess_speech_tokens([1, 2, BOS, 3, 7000, 4, EOS, 5], get_variant("original")) == [3, 4]
    assert "vocodes 2 of 8 speech tokens" in caplog.text and "markers (5 cut)" in caplog.text


def test_nothing_is_said_when_every_token_is_vocoded(caplog):
    with caplog.at_level(logging.WARNING):
        postprocess_speech_tokens([1, 2, 3], get_variant("original"))
    assert caplog.records == []
