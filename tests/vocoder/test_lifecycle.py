"""Job life cycle: abort, failure isolation, input errors, the voice cache, counters."""
from __future__ import annotations

import pytest
import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.voices import Voice
from tests.vocoder.conftest import drain, joined
from tests.vocoder.models import random_tokens, random_voice


def _broken_voice() -> Voice:
    """A voice whose prompt mel is longer than its prompt and a few tokens make: the flow
    rejects it inside the pass."""
    voice = random_voice(4, seed=99)
    return Voice(speaker_embedding=voice.speaker_embedding, t3_prompt_tokens=voice.t3_prompt_tokens,
                 s3gen_prompt_tokens=voice.s3gen_prompt_tokens,
                 s3gen_prompt_mel=torch.randn(1, 200, 80), xvector=voice.xvector, name="broken")


def _alone(s3gen, tokens, voice, seed, streaming):
    stage = VocoderStage(s3gen)
    stage.add("j", voice, seed=seed, streaming=streaming, n_steps=2)
    stage.push("j", tokens, final=True)
    return joined(drain(stage)["j"])


def test_abort_drops_the_job_and_its_pending_work(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    stage.add("a", random_voice(10), seed=1, streaming=True)
    stage.push("a", random_tokens(40, seed=1))
    assert stage.has_work()
    stage.abort("a")
    assert not stage.has_work() and not stage.has_job("a") and stage.step() == []
    stage.abort("a")  # aborting twice (or after the end) is harmless
    with pytest.raises(KeyError):
        stage.push("a", [1])


def test_abort_mid_stream_leaves_other_jobs_unchanged(tiny_turbo):
    voice, tokens = random_voice(15, seed=2), random_tokens(60, seed=3)
    stage = VocoderStage(tiny_turbo)
    for job in ("keep", "drop"):
        stage.add(job, voice, seed=5, streaming=True, n_steps=2)
        stage.push(job, tokens[:30])
    first = stage.step()
    assert {o.job_id for o in first} == {"keep", "drop"}
    stage.abort("drop")
    stage.push("keep", tokens[30:], final=True)
    rest = drain(stage)
    assert set(rest) == {"keep"}
    kept = torch.cat([o.samples for o in first if o.job_id == "keep"] + [joined(rest["keep"])])
    alone = _alone(tiny_turbo, tokens, voice, 5, streaming=True)
    assert kept.shape == alone.shape and (kept - alone).abs().max().item() <= 1e-4


def test_a_failed_pass_fails_only_its_jobs(tiny_original):
    stage = VocoderStage(tiny_original, VocoderConfig(max_batch_items=1))
    good_voice, tokens = random_voice(15, seed=4), random_tokens(12, seed=5)
    stage.add("bad", _broken_voice(), seed=1, streaming=False, n_steps=2)
    stage.add("good", good_voice, seed=2, streaming=False, n_steps=2)
    stage.push("bad", [1, 2, 3], final=True)
    stage.push("good", tokens, final=True)
    [failed] = stage.step()
    assert failed.job_id == "bad" and failed.final and failed.error and failed.samples.numel() == 0
    assert not stage.has_job("bad") and stage.stats.failed_passes == 1
    [ok] = stage.step()
    assert ok.job_id == "good" and ok.error is None
    assert torch.equal(ok.samples, _alone(tiny_original, tokens, good_voice, 2, streaming=False))


def test_a_failed_pass_frees_its_streaming_jobs(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    stage.add("bad", _broken_voice(), seed=1, streaming=True, n_steps=2)
    stage.push("bad", [1, 2], final=True)
    [failed] = stage.step()
    assert failed.error and failed.final and not stage.has_work() and not stage.has_job("bad")


def test_input_errors_are_clear(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    stage.add("a", random_voice(10), seed=1, streaming=False)
    with pytest.raises(ValueError, match="already exists"):
        stage.add("a", random_voice(10), seed=1, streaming=False)
    with pytest.raises(TypeError):
        stage.add("b", "not a voice", seed=1, streaming=False)
    with pytest.raises(ValueError, match="n_steps"):
        stage.add("c", random_voice(10), seed=1, streaming=False, n_steps=0)
    stage.push("a", [1], final=True)
    with pytest.raises(ValueError, match="final"):
        stage.push("a", [2])


def test_voice_cache_is_bounded_and_least_recently_used(tiny_turbo):
    stage = VocoderStage(tiny_turbo, VocoderConfig(voice_cache_size=2))
    voices = [random_voice(8, seed=s) for s in range(3)]
    for i, voice in enumerate([voices[0], voices[1], voices[0], voices[2]]):
        stage.add(f"j{i}", voice, seed=i, streaming=False, n_steps=1)
        stage.push(f"j{i}", [1, 2], final=True)
        drain(stage)
    assert len(stage.voices) == 2
    assert voices[0] in stage.voices and voices[2] in stage.voices and voices[1] not in stage.voices
    assert stage.voices.hits >= 1


def test_cached_speaker_vector_is_the_flows_projection(tiny_turbo):
    voice = random_voice(8, seed=1)
    entry = VocoderStage(tiny_turbo).voices.get(voice)
    assert torch.equal(entry.speaker, tiny_turbo.flow.speaker_projection(voice.xvector)[0])


def test_stats_count_passes_items_and_audio(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    for i in range(2):
        stage.add(f"j{i}", random_voice(8, seed=i), seed=i, streaming=False)
        stage.push(f"j{i}", random_tokens(22, seed=i), final=True)
    drain(stage)
    stats = stage.stats
    assert (stats.passes, stats.items) == (1, 2)
    assert stats.audio_seconds == pytest.approx(2 * 25 * 960 / 24000)
    assert stats.flow_seconds > 0 and stats.hift_seconds > 0
    assert stats.padded_tokens >= stats.real_tokens > 0


def _pass_with_nan_in_hift(s3gen, where: str) -> dict[str, list]:
    """One pass over a short (12 tokens) and a long (30 tokens) non-streaming job, HiFT's
    waveform turned NaN at one sample: ``"long"``, the long job's first sample, or ``"padding"``,
    the short job's row just past its own frames (the batch is padded to the long job's)."""
    stage = VocoderStage(s3gen)
    run_hift = stage.graphs.run_hift

    def nan_hift(call):
        wav, f0 = run_hift(call)
        wav, counts = wav.clone(), call.counts.tolist()
        short, long = counts.index(min(counts)), counts.index(max(counts))
        row, sample = (long, 0) if where == "long" else (short, 480 * counts[short])
        wav[row, sample] = float("nan")
        return wav, f0

    stage.graphs.run_hift = nan_hift
    for job, length in (("short", 12), ("long", 30)):
        stage.add(job, random_voice(10, seed=1), seed=3, streaming=False, n_steps=2)
        stage.push(job, random_tokens(length, seed=2), final=True)
    pieces = drain(stage)
    assert stage.stats.passes == 1
    return pieces


def test_a_job_whose_pass_audio_is_not_finite_fails_alone(tiny_turbo):
    pieces = _pass_with_nan_in_hift(tiny_turbo, "long")
    assert "non-finite" in pieces["long"][-1].error
    assert pieces["short"][-1].error is None and bool(torch.isfinite(joined(pieces["short"])).all())


def test_a_nan_in_a_row_s_padding_fails_no_job(tiny_turbo):
    pieces = _pass_with_nan_in_hift(tiny_turbo, "padding")
    assert all(outs[-1].error is None and outs[-1].final for outs in pieces.values())
