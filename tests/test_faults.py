"""Fault injection (chorus/faults.py) and what a fault costs at the engine and the vocoder:
only the affected requests or jobs fail, NaN never becomes a token or audio, nothing leaks.
The server-level consequences (500s, /ready, KV blocks after drain) are in
tests/server/test_faults.py."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.request import FinishReason
from chorus.faults import FaultConfig, FaultRule, Faults, InjectedFault, from_env
from chorus.sampling import SamplingParams
from chorus.vocoder import VocoderStage
from tests.engine.tiny_models import conditioning, tiny, voice
from tests.vocoder.conftest import drain
from tests.vocoder.models import random_s3gen, random_tokens, random_voice


@pytest.fixture(scope="module")
def tiny_turbo():
    return random_s3gen("turbo", seed=3)


# ---- the rules --------------------------------------------------------------------------------

def test_off_unless_chorus_faults_is_set():
    assert from_env({}) is None and from_env({"CHORUS_FAULTS": " "}) is None
    faults = from_env({"CHORUS_FAULTS": "t3_step:raise:0.01,vocoder_pass:nan:@3", "CHORUS_FAULTS_SEED": "7"})
    assert faults.config == FaultConfig((FaultRule("t3_step", "raise", rate=0.01),
                                         FaultRule("vocoder_pass", "nan", nth=3)), seed=7)


@pytest.mark.parametrize("spec, words", [("t3_step:raise", "SITE:MODE"), ("gpu:raise:0.1", "site"),
                                         ("t3_step:explode:0.1", "mode"), ("t3_step:nan:1.5", "rate"),
                                         ("t3_step:nan:@0", "@N"), ("t3_step:nan:often", "bad rule")])
def test_a_bad_rule_is_refused_with_the_reason(spec, words):
    with pytest.raises(ValueError, match=words):
        FaultConfig.parse(spec)


def test_nth_fails_exactly_that_check_of_its_site():
    faults = Faults.parse("t3_step:raise:@2,vocoder_pass:nan:@1")
    assert faults.check("t3_step") is False
    assert faults.check("vocoder_pass") is True  # sites count separately
    with pytest.raises(InjectedFault):
        faults.check("t3_step")
    assert [faults.check("t3_step") for _ in range(5)] == [False] * 5
    assert faults.fired == {("t3_step", "raise"): 1, ("vocoder_pass", "nan"): 1}


def test_rates_are_reproducible_from_the_seed_and_oom_is_cuda_s():
    def run(seed):
        faults, seen = Faults.parse("t3_step:oom:0.3", seed), []
        for _ in range(200):
            try:
                seen.append(faults.check("t3_step"))
            except torch.cuda.OutOfMemoryError:
                seen.append("oom")
        return seen

    first = run(1)
    assert first == run(1) and first != run(2)
    assert 30 < first.count("oom") < 90 and set(first) == {False, "oom"}


# ---- the T3 engine ----------------------------------------------------------------------------

def _engine():
    variant, model = tiny("turbo")
    config = EngineConfig(variant=variant.name, default_deadline_s=None, cache=CacheConfig(kv_cache_bytes=64 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1024))
    return variant, model, T3Engine(model, variant, config)


def _requests(variant, model, n, tokens=10):
    return [T3Request(list(range(3, 11)), conditioning(variant, model, voice(variant, seed)),
                      SamplingParams.for_variant(variant, seed=seed, max_new_tokens=tokens, min_new_tokens=tokens),
                      request_id=f"r{seed}") for seed in range(n)]


def _blocks_free(engine) -> bool:
    return engine.kv_manager.num_free_blocks == engine.kv_cache.num_blocks


@pytest.mark.parametrize("mode, error", [("raise", "InjectedFault"), ("oom", "OutOfMemoryError")])
def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(mode, error):
    variant, model, engine = _engine()
    engine.runner.faults = Faults.parse(f"t3_step:{mode}:@3")  # mid-decode
    results = engine.generate(_requests(variant, model, 2))
    assert [r.finish_reason for r in results] == [FinishReason.ERROR] * 2
    assert all(error in r.error for r in results) and _blocks_free(engine)
    [after] = engine.generate(_requests(variant, model, 1))
    assert after.finish_reason is FinishReason.LENGTH and len(after.tokens) == 10


def test_nan_logits_fail_only_their_request_and_never_become_a_token():
    variant, model, engine = _engine()
    clean = engine.generate(_requests(variant, model, 2))
    engine.runner.faults = Faults.parse("t3_step:nan:@4")  # poisons the first logits row of that step
    results = engine.generate(_requests(variant, model, 2))
    failed = [r for r in results if r.finish_reason is FinishReason.ERROR]
    assert len(failed) == 1 and "NaN logits" in failed[0].error
    assert len(failed[0].tokens) < 10  # nothing sampled from the NaN step on
    [ok] = [r for r in results if r.finish_reason is not FinishReason.ERROR]
    assert ok.tokens == next(c.tokens for c in clean if c.request_id == ok.request_id)  # untouched
    assert _blocks_free(engine) and engine.runner.faults.fired[("t3_step", "nan")] == 1


# ---- the vocoder stage ------------------------------------------------------------------------

def test_nan_audio_fails_only_its_job(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    stage.faults = Faults.parse("vocoder_pass:nan:@1")
    for job in ("a", "b"):
        stage.add(job, random_voice(10, seed=1), seed=3, streaming=True, n_steps=2)
        stage.push(job, random_tokens(12, seed=2), final=True)
    pieces = drain(stage)
    failed = [job for job, outs in pieces.items() if any(o.error for o in outs)]
    assert len(failed) == 1 and "non-finite" in pieces[failed[0]][-1].error
    [good] = set(pieces) - set(failed)
    audio = torch.cat([o.samples for o in pieces[good]])
    assert audio.numel() and bool(torch.isfinite(audio).all())
    assert not stage.has_job("a") and not stage.has_job("b")


def test_a_raising_pass_fails_its_jobs_and_the_next_pass_runs(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    stage.faults = Faults.parse("vocoder_pass:oom:@1")
    stage.add("a", random_voice(10, seed=1), seed=3, streaming=True, n_steps=2)
    stage.push("a", random_tokens(12, seed=2), final=True)
    [failed] = stage.step()
    assert failed.final and "OutOfMemoryError" in failed.error and stage.stats.failed_passes == 1
    stage.add("b", random_voice(10, seed=1), seed=3, streaming=True, n_steps=2)
    stage.push("b", random_tokens(12, seed=2), final=True)
    assert all(o.error is None for o in drain(stage)["b"])


def test_chorus_faults_reaches_the_engine_and_the_vocoder_of_a_new_process(monkeypatch, tiny_turbo):
    """How a subprocess server gets its faults: the environment, read when the stages are built."""
    monkeypatch.setenv("CHORUS_FAULTS", "t3_step:raise:@1,vocoder_pass:nan:0.5")
    monkeypatch.setenv("CHORUS_FAULTS_SEED", "3")
    engine, stage = _engine()[2], VocoderStage(tiny_turbo)
    assert engine.runner.faults.config.seed == 3 and len(stage.faults.config.rules) == 2
    monkeypatch.delenv("CHORUS_FAULTS")
    assert _engine()[2].runner.faults is None and VocoderStage(tiny_turbo).faults is None
