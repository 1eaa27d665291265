"""Streaming jobs: windowed audio against the same job vocoded in one pass (same seed, same
noise layout), exact lengths, no clicks at piece boundaries, push granularity not mattering.

Bounds come from a measurement on these tiny random models (docs/vocoder.md, "Measured"):
SNR 15.3-15.5 dB and boundary/interior jump ratios 0.83-0.89 with the default config.
"""
from __future__ import annotations

import pytest
import torch

from chorus.models.s3gen.s3gen import S3Gen
from chorus.models.variants import get_variant
from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.quality import boundary_jumps, one_pass_config, snr_db
from tests.vocoder.conftest import drain, joined
from tests.vocoder.models import random_tokens, random_voice

MIN_SNR_DB = 12.0
MAX_JUMP_RATIO = 1.5
CONFIG = VocoderConfig()


def _stream(s3gen, tokens, voice, seed, push_sizes, config=CONFIG):
    stage = VocoderStage(s3gen, config)
    stage.add("s", voice, seed=seed, streaming=True, n_steps=2)
    i, k = 0, 0
    while i < len(tokens):
        size = push_sizes[k % len(push_sizes)]
        stage.push("s", tokens[i:i + size], final=i + size >= len(tokens))
        i, k = i + size, k + 1
        pieces = drain(stage).get("s", [])
        yield from pieces
    assert not stage.has_job("s")


def _one_pass(s3gen, tokens, voice, seed):
    return list(_stream(s3gen, tokens, voice, seed, [len(tokens) or 1], one_pass_config(CONFIG)))


@pytest.fixture(scope="module", params=["turbo", "original"])
def streamed(request, tiny_models):
    s3gen = tiny_models[request.param]
    voice, tokens = random_voice(50, seed=4), random_tokens(150, seed=5)
    pieces = list(_stream(s3gen, tokens, voice, 7, [7]))
    [reference] = _one_pass(s3gen, tokens, voice, 7)
    return s3gen, pieces, reference.samples


def test_stream_comes_in_several_pieces_and_only_the_last_is_final(streamed):
    _, pieces, _ = streamed
    assert len(pieces) >= 3
    assert [p.final for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert pieces[0].samples.shape[0] < 20 * 960  # the first window is small


def test_window_growth_sets_how_many_pieces_a_stream_takes(tiny_turbo):
    voice, tokens = random_voice(50, seed=4), random_tokens(150, seed=5)
    # pushed one token at a time, a pass runs as soon as its window (+ 3 held back) is there:
    # doubling windows end at 20, 60, 140 and the rest; growing by 4, at 20, 100 and the rest
    doubling = list(_stream(tiny_turbo, tokens, voice, 7, [1]))
    by_four = list(_stream(tiny_turbo, tokens, voice, 7, [1], VocoderConfig(window_growth=4)))
    assert (len(doubling), len(by_four)) == (4, 3)
    assert joined(by_four).shape == joined(doubling).shape


def test_streamed_length_equals_one_pass_length(streamed):
    s3gen, pieces, reference = streamed
    assert joined(pieces).shape == reference.shape
    assert reference.shape[0] == 960 * (150 + s3gen.variant.append_silence_tokens)


def test_streamed_audio_is_close_to_one_pass(streamed):
    _, pieces, reference = streamed
    assert snr_db(reference, joined(pieces)) >= MIN_SNR_DB


def test_no_click_at_piece_boundaries(streamed):
    _, pieces, _ = streamed
    starts = torch.tensor([p.samples.shape[0] for p in pieces]).cumsum(0)[:-1].tolist()
    jumps = boundary_jumps(joined(pieces), starts, reach=CONFIG.crossfade_frames * 480 + 1)
    assert jumps.ratio <= MAX_JUMP_RATIO


def test_stream_starts_with_the_trim_and_fade(streamed):
    _, pieces, _ = streamed
    assert bool((pieces[0].samples[:480] == 0).all())


def test_push_sizes_do_not_change_the_audio(tiny_turbo):
    voice, tokens = random_voice(20, seed=1), random_tokens(90, seed=2)
    by_sevens = joined(list(_stream(tiny_turbo, tokens, voice, 3, [7])))
    odd = joined(list(_stream(tiny_turbo, tokens, voice, 3, [1, 13, 4, 29])))
    at_once = joined(list(_stream(tiny_turbo, tokens, voice, 3, [90])))
    assert torch.equal(by_sevens, odd) and torch.equal(by_sevens, at_once)


def test_short_stream_is_one_final_piece_of_one_pass_audio(tiny_original):
    voice, tokens = random_voice(20, seed=1), random_tokens(10, seed=2)
    [piece] = list(_stream(tiny_original, tokens, voice, 3, [4]))
    [reference] = _one_pass(tiny_original, tokens, voice, 3)
    assert piece.final and torch.equal(piece.samples, reference.samples)


def test_multilingual_stream_cuts_the_last_token_at_the_end_only(tiny_original):
    multilingual = S3Gen(get_variant("multilingual"), tiny_original.flow, tiny_original.mel2wav)
    voice, tokens = random_voice(30, seed=1), random_tokens(70, seed=2)
    streamed = joined(list(_stream(multilingual, tokens, voice, 3, [5])))
    [reference] = _one_pass(multilingual, tokens, voice, 3)
    assert streamed.shape[0] == reference.samples.shape[0] == 69 * 960


def test_original_stream_applies_markers_and_drops_invalid_ids(tiny_original):
    voice, clean = random_voice(20, seed=1), random_tokens(60, seed=2)
    raw = [17, 6561] + clean[:30] + [7000] + clean[30:] + [6562, 99, 6561, 5]
    from_raw = joined(list(_stream(tiny_original, raw, voice, 3, [6])))
    from_clean = joined(list(_stream(tiny_original, clean, voice, 3, [6])))
    assert torch.equal(from_raw, from_clean)


def test_turbo_stream_appends_silence_tokens_at_the_end(tiny_turbo):
    voice, tokens = random_voice(20, seed=1), random_tokens(50, seed=2)
    streamed = joined(list(_stream(tiny_turbo, tokens + [6561, 7000], voice, 3, [9])))
    assert streamed.shape[0] == 53 * 960
    [one_pass_length] = [w.shape[0] for w in tiny_turbo.tokens_to_wav([tokens], voice, seeds=[3], n_steps=2)]
    assert streamed.shape[0] == one_pass_length


def test_streams_in_one_batch_equal_each_stream_alone(tiny_turbo):
    voices = [random_voice(20, seed=1), random_voice(35, seed=2)]
    jobs = {f"s{i}": (random_tokens(40 + 17 * i, seed=i), voices[i % 2], 10 + i) for i in range(3)}
    stage = VocoderStage(tiny_turbo, CONFIG)
    for job_id, (tokens, voice, seed) in jobs.items():
        stage.add(job_id, voice, seed=seed, streaming=True, n_steps=2)
        stage.push(job_id, tokens, final=True)
    together = {k: joined(v) for k, v in drain(stage).items()}
    assert stage.stats.items > stage.stats.passes  # jobs did share passes
    for job_id, (tokens, voice, seed) in jobs.items():
        alone = joined(list(_stream(tiny_turbo, tokens, voice, seed, [len(tokens)])))
        assert together[job_id].shape == alone.shape
        assert (together[job_id] - alone).abs().max().item() <= 1e-4


@pytest.mark.parametrize("value", [0, 1.5, True])
def test_config_rejects_a_bad_window_growth(value):
    with pytest.raises(ValueError, match="window_growth"):
        VocoderConfig(window_growth=value)
