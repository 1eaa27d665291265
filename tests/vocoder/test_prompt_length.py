"""The prompt-length cap (``VocoderConfig.prompt_tokens``): only the last K tokens of a voice's
S3Gen prompt and their mel frames condition the flow."""
from __future__ import annotations

import pytest
import torch

from chorus.vocoder import VocoderConfig
from chorus.vocoder.voice_cache import VoiceCache, last_prompt_tokens
from chorus.voices import Voice
from tests.vocoder.conftest import one_job_audio
from tests.vocoder.models import local_flow, random_tokens, random_voice


def _trimmed_by_hand(voice: Voice, keep: int) -> Voice:
    drop = voice.s3gen_prompt_tokens.shape[1] - keep
    return Voice(speaker_embedding=voice.speaker_embedding, t3_prompt_tokens=voice.t3_prompt_tokens,
                 s3gen_prompt_tokens=voice.s3gen_prompt_tokens[:, drop:],
                 s3gen_prompt_mel=voice.s3gen_prompt_mel[:, 2 * drop:], xvector=voice.xvector, name="trimmed")


@pytest.mark.parametrize("streaming", [False, True])
def test_cap_at_least_the_prompt_gives_the_reference_audio(tiny_turbo, streaming):
    voice, tokens = random_voice(30, seed=1, odd_mel=True), random_tokens(70, seed=2)
    whole, _ = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(), streaming)
    capped, _ = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(prompt_tokens=30), streaming)
    assert torch.equal(whole, capped)


@pytest.mark.parametrize("shift", [-1, 0, 1])
def test_kept_mel_frames_are_those_of_the_kept_tokens(shift):
    tokens = torch.arange(30)
    mel = torch.arange(60 + shift).float()[:, None].expand(-1, 80)  # frame i holds the value i
    kept_tokens, kept_mel = last_prompt_tokens(tokens, mel, 12)
    assert kept_tokens.tolist() == list(range(18, 30))
    assert kept_mel[:, 0].tolist() == list(range(36, 60 + shift))  # 2 frames per token, parity kept


@pytest.mark.parametrize("name", ["turbo", "original"])
def test_capped_prompt_equals_a_voice_trimmed_by_hand(tiny_models, name):
    """Non-streaming audio with the cap is the audio of the same voice with its prompt cut to the
    last K tokens and 2 K (+- the odd frame) mel frames."""
    voice, tokens = random_voice(30, seed=3, odd_mel=name == "turbo"), random_tokens(40, seed=4)
    capped, stats = one_job_audio(tiny_models[name], voice, tokens, VocoderConfig(prompt_tokens=12), False)
    by_hand, _ = one_job_audio(tiny_models[name], _trimmed_by_hand(voice, 12), tokens, VocoderConfig(), False)
    assert stats.real_tokens == 12 + 40 + tiny_models[name].variant.append_silence_tokens
    assert torch.equal(capped, by_hand)


@pytest.mark.parametrize("odd_mel", [False, True])
def test_capped_prompt_keeps_the_noise_of_a_streams_frames(tiny_turbo, monkeypatch, odd_mel):
    """A stream's new frames keep their noise columns under the cap: with a flow without
    attention (only the prompt's context is cut) the audio is bitwise the full prompt's."""
    monkeypatch.setattr(tiny_turbo.flow, "generate_mel", local_flow(tiny_turbo))
    voice, tokens = random_voice(30, seed=1, odd_mel=odd_mel), random_tokens(90, seed=2)
    whole, whole_stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(), True)
    capped, stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(prompt_tokens=8), True)
    assert stats.real_tokens == whole_stats.real_tokens - stats.passes * (30 - 8)  # 8 prompt tokens a pass
    assert torch.equal(whole, capped)


def test_cache_key_includes_the_cap(tiny_turbo):
    cache = VoiceCache(tiny_turbo.flow, capacity=4, prompt_tokens=None)
    voice = random_voice(30, seed=5)
    assert cache.get(voice).num_tokens == 30
    cache.prompt_tokens = 10
    assert voice not in cache
    assert cache.get(voice).num_tokens == 10 and len(cache) == 2


@pytest.mark.parametrize("value", [0, -3, 1.5, False])
def test_config_rejects_a_bad_prompt_cap(value):
    with pytest.raises(ValueError, match="prompt_tokens"):
        VocoderConfig(prompt_tokens=value)
