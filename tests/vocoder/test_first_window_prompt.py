"""The first-window prompt cap (``VocoderConfig.first_window_prompt_tokens``): a stream's first
pass conditions the flow on the last K tokens of the voice prompt, every later pass on the prompt
as ``prompt_tokens`` leaves it."""
from __future__ import annotations

import pytest
import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.pass_graphs import frame_bucket
from chorus.vocoder.warmup import warmup_shapes
from chorus.vocoder.voice_cache import VoiceCache
from tests.vocoder.conftest import drain, one_job_audio, record_flow_frames
from tests.vocoder.models import local_flow, random_tokens, random_voice


def test_only_a_streams_first_pass_reads_the_capped_prompt(tiny_turbo):
    voice, tokens = random_voice(30, seed=1), random_tokens(90, seed=2)
    whole, whole_stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(), True)
    capped, stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(first_window_prompt_tokens=8), True)
    assert stats.passes == whole_stats.passes > 2
    assert stats.real_tokens == whole_stats.real_tokens - (30 - 8)
    assert capped.shape == whole.shape and not torch.equal(capped, whole)


@pytest.mark.parametrize("odd_mel", [False, True])
def test_the_first_pass_keeps_the_noise_of_its_frames(tiny_turbo, monkeypatch, odd_mel):
    """With a flow without attention (only the prompt's context is cut) the capped stream is
    bitwise the uncapped one: its new frames keep their noise columns and positions."""
    monkeypatch.setattr(tiny_turbo.flow, "generate_mel", local_flow(tiny_turbo))
    voice, tokens = random_voice(30, seed=1, odd_mel=odd_mel), random_tokens(90, seed=2)
    whole, _ = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(), True)
    capped, _ = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(first_window_prompt_tokens=8), True)
    assert torch.equal(whole, capped)


def test_a_cap_at_least_the_prompt_changes_nothing(tiny_turbo):
    voice, tokens = random_voice(30, seed=1, odd_mel=True), random_tokens(70, seed=2)
    whole, _ = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(), True)
    capped, _ = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(first_window_prompt_tokens=30), True)
    assert torch.equal(whole, capped)


def test_non_streaming_jobs_keep_the_whole_prompt(tiny_turbo):
    voice, tokens = random_voice(30, seed=3), random_tokens(40, seed=4)
    whole, whole_stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(), False)
    capped, stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(first_window_prompt_tokens=8), False)
    assert stats.real_tokens == whole_stats.real_tokens
    assert torch.equal(whole, capped)


def test_the_smaller_of_the_two_caps_holds(tiny_turbo):
    voice, tokens = random_voice(30, seed=1), random_tokens(90, seed=2)
    both, stats = one_job_audio(tiny_turbo, voice, tokens,
                         VocoderConfig(prompt_tokens=12, first_window_prompt_tokens=20), True)
    only, only_stats = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(prompt_tokens=12), True)
    assert stats.real_tokens == only_stats.real_tokens and torch.equal(both, only)
    _, tighter = one_job_audio(tiny_turbo, voice, tokens, VocoderConfig(prompt_tokens=12, first_window_prompt_tokens=5), True)
    assert tighter.real_tokens == only_stats.real_tokens - (12 - 5)


def test_each_cap_is_its_own_cache_entry(tiny_turbo):
    cache = VoiceCache(tiny_turbo.flow, capacity=4, prompt_tokens=20)
    voice = random_voice(30, seed=5)
    assert cache.get(voice).num_tokens == 20
    first = cache.get(voice, keep=8)
    assert first.num_tokens == 8 and first.dropped_tokens == 22 and len(cache) == 2
    assert cache.get(voice, keep=25).num_tokens == 20 and len(cache) == 2  # the same entry as no keep


def test_warmup_captures_the_capped_first_window():
    config = VocoderConfig(max_batch_items=1, first_window_prompt_tokens=5)
    shapes = warmup_shapes(config, ratio=2, prompt_tokens=30, chunk_tokens=60, whole_chunk_tokens=None, most_rows=1)
    # the first window over 5 prompt tokens: 2 (5 + 23) = 56 -> 64; then 2 (30 + 23) = 106 -> 128
    # (kept: a final first pass of a longer stream never reads it, but a second window ending at
    # 20 tokens would) and 2 (30 + 63) = 186 -> 192
    assert [s for s in shapes if s[0] == "flow"] == [("flow", (1, 64)), ("flow", (1, 128)), ("flow", (1, 192))]


def test_warmup_covers_every_first_pass_over_the_capped_prompt():
    # a first pass over the capped prompt reads the first window (20 + 3 held back), or, if it is
    # also the stream's last, 1 to 23 tokens plus 3 silence tokens, or a follower's first window
    # (100 + 3): none of these lie in the buckets of the whole prompt's passes
    config = VocoderConfig(max_batch_items=1, first_window_prompt_tokens=50, follower_first_window_tokens=100)
    shapes = warmup_shapes(config, ratio=2, prompt_tokens=250, chunk_tokens=240, whole_chunk_tokens=None,
                           most_rows=1, silence_tokens=3)
    flow = {frames for kind, (_, frames) in shapes if kind == "flow"}
    first_passes = [50 + 23] + [50 + n + 3 for n in range(1, 24)] + [50 + 103]
    assert {frame_bucket(2 * tokens) for tokens in first_passes} <= flow
    uncapped = warmup_shapes(VocoderConfig(max_batch_items=1, follower_first_window_tokens=100), 2, 250, 240, None, 1, 3)
    assert set(shapes) - set(uncapped) == {("flow", (1, frames)) for frames in (128, 192, 256, 320)}


def test_warmup_covers_the_flow_shapes_that_capped_streams_run(tiny_turbo):
    # one listener's streams of 1 to 30 tokens, each pushed at once: a first pass that is also
    # the stream's last (up to 23 tokens), and followers (added while the listener still has
    # audio to hear) with their longer first window; every flow call's frame bucket is one that
    # warm-up captures (a 250-token prompt capped at 50, as in the server)
    config = VocoderConfig(first_window_prompt_tokens=50, follower_first_window_tokens=100)
    stage = VocoderStage(tiny_turbo, config)
    frames = record_flow_frames(stage)
    voice = random_voice(250, seed=1)
    for n in [*range(1, 31, 3), 120]:
        stage.add(f"s{n}", voice, seed=n, streaming=True, listener="agent")
        stage.push(f"s{n}", random_tokens(n, seed=n), final=True)
        drain(stage)
    shapes = warmup_shapes(config, ratio=2, prompt_tokens=250, chunk_tokens=240, whole_chunk_tokens=None,
                           most_rows=1, silence_tokens=tiny_turbo.variant.append_silence_tokens)
    assert {frame_bucket(f) for f in frames} <= {f for kind, (_, f) in shapes if kind == "flow"}
    assert {128, 192, 320} <= {frame_bucket(f) for f in frames}  # short, first-window and follower passes


@pytest.mark.parametrize("value", [0, -3, 1.5, False])
def test_config_rejects_a_bad_first_window_cap(value):
    with pytest.raises(ValueError, match="first_window_prompt_tokens"):
        VocoderConfig(first_window_prompt_tokens=value)
