"""Non-streaming jobs: one piece per job, equal to ``S3Gen.tokens_to_wav`` for the same raw
tokens and seed; batching across jobs changes nobody's audio."""
from __future__ import annotations

import pytest
import torch

from chorus.models.s3gen.s3gen import S3Gen
from chorus.models.variants import get_variant
from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.conftest import drain
from tests.vocoder.models import random_tokens, random_voice

BATCH_TOLERANCE = 1e-4  # the batched-vs-single bound of the S3Gen tests
BOS, EOS = 6561, 6562


def _one_job(s3gen, raw, voice, seed, n_steps=2):
    stage = VocoderStage(s3gen)
    stage.add("j", voice, seed=seed, streaming=False, n_steps=n_steps)
    stage.push("j", raw, final=True)
    [out] = stage.step()
    assert out.final and out.error is None and not stage.has_work()
    return out.samples


@pytest.mark.parametrize("name", ["turbo", "original"])
def test_non_streaming_equals_tokens_to_wav(tiny_models, name):
    s3gen = tiny_models[name]
    voice = random_voice(30, seed=1, odd_mel=name == "turbo")
    raw = [BOS] + random_tokens(40, seed=2) + [7000, EOS, 5]
    got = _one_job(s3gen, raw, voice, seed=9)
    [expected] = s3gen.tokens_to_wav([raw], voice, seeds=[9], n_steps=2)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert (got - expected).abs().max().item() <= BATCH_TOLERANCE


def test_multilingual_non_streaming_cuts_the_last_token(tiny_original):
    multilingual = S3Gen(get_variant("multilingual"), tiny_original.flow, tiny_original.mel2wav)
    voice, raw = random_voice(20, seed=3), [BOS] + random_tokens(12, seed=4) + [EOS]
    got = _one_job(multilingual, raw, voice, seed=1)
    [expected] = multilingual.tokens_to_wav([raw], voice, seeds=[1], n_steps=2)
    assert got.shape[0] == 11 * 960 == expected.shape[0]
    assert (got - expected).abs().max().item() <= BATCH_TOLERANCE


def test_job_without_usable_tokens_finishes_empty_without_a_pass(tiny_original):
    stage = VocoderStage(tiny_original)
    stage.add("j", random_voice(10), seed=1, streaming=False)
    stage.push("j", [EOS, 1, 2], final=True)
    [out] = stage.step()
    assert out.final and out.samples.shape == (0,) and out.error is None
    assert stage.stats.passes == 0 and not stage.has_job("j")


def test_batched_jobs_equal_each_job_alone(tiny_turbo):
    voices = [random_voice(30, seed=5), random_voice(22, seed=6, odd_mel=True)]
    jobs = [(random_tokens(n, seed=10 + n), voices[n % 2], 100 + n) for n in (7, 30, 1, 18)]
    stage = VocoderStage(tiny_turbo, VocoderConfig(max_batch_items=8))
    for i, (tokens, voice, seed) in enumerate(jobs):
        stage.add(f"j{i}", voice, seed=seed, streaming=False, n_steps=2)
        stage.push(f"j{i}", tokens, final=True)
    outs = {o.job_id: o.samples for o in stage.step()}
    assert stage.stats.passes == 1 and stage.stats.items == 4
    for i, (tokens, voice, seed) in enumerate(jobs):
        alone = _one_job(tiny_turbo, tokens, voice, seed)
        assert outs[f"j{i}"].shape == alone.shape
        assert (outs[f"j{i}"] - alone).abs().max().item() <= BATCH_TOLERANCE


def test_a_jobs_audio_does_not_depend_on_its_batch_mates(tiny_original):
    voice = random_voice(25, seed=7)
    target = random_tokens(20, seed=8)
    results = []
    for mates in ([], [random_tokens(35, seed=9)], [random_tokens(5, seed=10), random_tokens(50, seed=11)]):
        stage = VocoderStage(tiny_original)
        stage.add("target", voice, seed=42, streaming=False, n_steps=2)
        for k, tokens in enumerate(mates):
            stage.add(f"mate{k}", random_voice(15, seed=20 + k), seed=k, streaming=False, n_steps=2)
            stage.push(f"mate{k}", tokens, final=True)
        stage.push("target", target, final=True)
        results.append(drain(stage)["target"][0].samples)
    for other in results[1:]:
        assert (other - results[0]).abs().max().item() <= BATCH_TOLERANCE


def test_jobs_with_different_solver_settings_run_in_separate_passes(tiny_original):
    stage = VocoderStage(tiny_original)
    voice = random_voice(10, seed=1)
    for job, steps in (("a", 2), ("b", 3)):
        stage.add(job, voice, seed=1, streaming=False, n_steps=steps)
        stage.push(job, random_tokens(5, seed=2), final=True)
    assert [o.job_id for o in stage.step()] == ["a"]
    assert [o.job_id for o in stage.step()] == ["b"]
