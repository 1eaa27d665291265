"""The left-context cap of streams (``VocoderConfig.stream_context_tokens``): a pass's flow reads
the prompt, at most L tokens before its HiFT context, the window and the held-back tokens.

Bounds come from these tiny random models (docs/vocoder.md, "Left context and prompt length"):
a 300-token stream capped at L = 25 measures 15.7 dB (turbo) and 15.2 dB (original) against its
one-pass audio (unbounded: 15.5 and 15.0 dB); the test requires 12 dB, as the streaming tests do.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.quality import one_pass_config, snr_db
from chorus.voices import Voice
from tests.vocoder.conftest import joined
from tests.vocoder.models import local_flow, random_tokens, random_voice

MIN_SNR_DB = 12.0
CONFIG = VocoderConfig(first_window_tokens=10, max_window_tokens=20, stream_context_tokens=8)


def _voice(prompt_tokens: int, shift: int, seed: int = 4) -> Voice:
    """A voice whose prompt mel has ``2 Tp + shift`` frames."""
    voice = random_voice(prompt_tokens, seed=seed)
    mel = torch.randn(1, 2 * prompt_tokens + shift, 80, generator=torch.Generator().manual_seed(seed)) - 5.0
    return Voice(speaker_embedding=voice.speaker_embedding, t3_prompt_tokens=voice.t3_prompt_tokens,
                 s3gen_prompt_tokens=voice.s3gen_prompt_tokens, s3gen_prompt_mel=mel,
                 xvector=voice.xvector, name=f"shift{shift}")


def _stream(s3gen, tokens, voice, config, push_sizes=(7,), seed=7, per_pass=None):
    """The stream's pieces; ``per_pass`` collects each pass's flow input (prompt + tokens)."""
    stage = VocoderStage(s3gen, config)
    stage.add("s", voice, seed=seed, streaming=True, n_steps=2)
    pieces, i, k = [], 0, 0
    while i < len(tokens):
        size = push_sizes[k % len(push_sizes)]
        stage.push("s", tokens[i:i + size], final=i + size >= len(tokens))
        i, k = i + size, k + 1
        while stage.has_work():
            before = stage.stats.real_tokens
            pieces += [o for o in stage.step() if o.job_id == "s"]
            if per_pass is not None:
                per_pass.append(stage.stats.real_tokens - before)
    assert not stage.has_job("s")
    return pieces


@pytest.mark.parametrize("name", ["turbo", "original"])
def test_cap_longer_than_the_stream_gives_the_unbounded_audio(tiny_models, name):
    voice, tokens = random_voice(30, seed=1, odd_mel=name == "turbo"), random_tokens(120, seed=2)
    unbounded = joined(_stream(tiny_models[name], tokens, voice, replace(CONFIG, stream_context_tokens=None)))
    capped = joined(_stream(tiny_models[name], tokens, voice, replace(CONFIG, stream_context_tokens=120)))
    assert torch.equal(unbounded, capped)


@pytest.mark.parametrize("shift", [-1, 0, 1])
def test_capped_stream_reads_each_frame_where_the_unbounded_stream_does(tiny_turbo, monkeypatch, shift):
    """Frame bookkeeping and noise addressing: with a flow without attention, a capped stream's
    audio is bitwise the unbounded stream's, for prompt mels of 2 Tp - 1, 2 Tp and 2 Tp + 1 frames."""
    monkeypatch.setattr(tiny_turbo.flow, "generate_mel", local_flow(tiny_turbo))
    voice, tokens = _voice(25, shift), random_tokens(150, seed=3)
    unbounded = joined(_stream(tiny_turbo, tokens, voice, replace(CONFIG, stream_context_tokens=None)))
    passes: list[int] = []
    capped = joined(_stream(tiny_turbo, tokens, voice, replace(CONFIG, stream_context_tokens=0), per_pass=passes))
    assert max(passes) < 25 + 150  # the cap did leave tokens out
    assert torch.equal(unbounded, capped)


@pytest.mark.parametrize("shift", [-1, 0, 1])
def test_capped_stream_length_is_exact(tiny_turbo, shift):
    """The one-pass length: 960 samples a token, one frame (480) more or less for an odd prompt
    mel (the flow returns the frames from the prompt mel's end on)."""
    voice, tokens = _voice(25, shift), random_tokens(150, seed=3)
    streamed = joined(_stream(tiny_turbo, tokens, voice, CONFIG))
    assert streamed.shape[0] == 960 * (150 + tiny_turbo.variant.append_silence_tokens) - 480 * shift


def test_capped_stream_does_not_depend_on_push_sizes(tiny_original):
    voice, tokens = random_voice(20, seed=1), random_tokens(130, seed=2)
    by_sevens = joined(_stream(tiny_original, tokens, voice, CONFIG, [7]))
    odd = joined(_stream(tiny_original, tokens, voice, CONFIG, [1, 13, 4, 29]))
    at_once = joined(_stream(tiny_original, tokens, voice, CONFIG, [130]))
    assert torch.equal(by_sevens, odd) and torch.equal(by_sevens, at_once)


def test_capped_pass_flow_input_is_bounded(tiny_turbo):
    """Each pass's flow input (what the stats count for it) is at most prompt + L + the HiFT
    context's tokens + the largest window + holdback (+ the final pass's silence tokens)."""
    voice, tokens = random_voice(30, seed=1), random_tokens(200, seed=2)
    passes: list[int] = []
    _stream(tiny_turbo, tokens, voice, CONFIG, per_pass=passes)
    cfg = CONFIG
    context = cfg.hift_context_frames // 2 + 1
    bound = 30 + cfg.stream_context_tokens + context + cfg.max_window_tokens + cfg.holdback_tokens \
        + tiny_turbo.variant.append_silence_tokens
    assert len(passes) >= 8 and max(passes) <= bound


@pytest.mark.parametrize("name", ["turbo", "original"])
def test_capped_stream_is_close_to_one_pass(tiny_models, name):
    s3gen = tiny_models[name]
    voice, tokens = random_voice(50, seed=4), random_tokens(300, seed=5)
    config = VocoderConfig(stream_context_tokens=25)
    streamed = joined(_stream(s3gen, tokens, voice, config))
    [reference] = _stream(s3gen, tokens, voice, one_pass_config(config), [300])
    assert snr_db(reference.samples, streamed) >= MIN_SNR_DB


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_config_rejects_a_bad_context_cap(value):
    with pytest.raises(ValueError, match="stream_context_tokens"):
        VocoderConfig(stream_context_tokens=value)
