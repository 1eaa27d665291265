"""Sequential synthesis end to end on a full-size random-weight Nano checkpoint (the smallest
variant; meanflow S3Gen): lengths, seeding, chunking, voices, parameter handling; and the
optional Perth watermark post-processor."""
from __future__ import annotations

import os
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
import torch

from chorus.audio import load_audio
from chorus.models.loading import Checkpoint
from chorus.models.random_checkpoint import RANDOM_WEIGHTS_TOKEN_CAP
from chorus.models.s3gen.s3gen import SAMPLES_PER_TOKEN
from chorus.models.variants import get_variant
from chorus.pipeline import SpeechModels
from chorus.pipeline.planner import plan_text
from chorus.pipeline.request import SpeechRequest
from chorus.synthesis import Synthesizer, synthesize
from chorus.text import TextInputError, UnsupportedLanguageError, load_text_encoder
from tests.conftest import DATA_DIR
from tests.voices.checkpoints import light_checkpoint, shared_checkpoint

N = 6  # speech tokens per chunk, forced with max_new_tokens == min_new_tokens
SILENCE = 3  # Nano appends three silence tokens per chunk
TEXT = "Hello there, this is Chorus."


@pytest.fixture(scope="module")
def synth():
    synth = Synthesizer.load("nano", shared_checkpoint("nano"), device="cpu")
    # A 2 s cut of the built-in voice: S3Gen's cost grows with the prompt, and the tests only
    # need some voice.
    builtin = synth.builtin_voice()
    synth.short_voice = replace(builtin, t3_prompt_tokens=builtin.t3_prompt_tokens[:, :75],
                                s3gen_prompt_tokens=builtin.s3gen_prompt_tokens[:, :50],
                                s3gen_prompt_mel=builtin.s3gen_prompt_mel[:, :100], name="short")
    return synth


def _run(synth, text=TEXT, **kwargs):
    kwargs = {"seed": 5, "max_new_tokens": N, "min_new_tokens": N, "voice": synth.short_voice, **kwargs}
    return synth.synthesize(text, **kwargs)


@pytest.mark.fullsize
def test_forced_token_count_gives_the_expected_length(synth):
    result = _run(synth)
    assert result.sample_rate == 24000 and result.wav.dtype == np.float32
    assert result.wav.shape == ((N + SILENCE) * SAMPLES_PER_TOKEN,)
    assert np.isfinite(result.wav).all() and np.abs(result.wav).max() <= 0.99
    [chunk] = result.chunks
    assert (chunk.speech_tokens, chunk.finish_reason, chunk.seed) == (N, "length", 5)


@pytest.mark.fullsize
def test_same_seed_same_audio_also_through_the_one_shot_function(synth):
    a = _run(synth).wav
    other = _run(synth, seed=6).wav
    assert not np.array_equal(a, other)
    wav, sample_rate = synthesize(TEXT, variant="nano", checkpoint=shared_checkpoint("nano"), seed=5,
                                  max_new_tokens=N, min_new_tokens=N, voice=synth.short_voice)
    assert sample_rate == 24000 and np.array_equal(wav, a)


@pytest.mark.fullsize
def test_parameters_nano_does_not_use_are_ignored(synth):
    """Chorus with and without them gives the same audio. (The reference's turbo ``generate()``
    also ignores them, with a warning; this test does not run the reference.)"""
    plain = _run(synth)
    with_extras = _run(synth, cfg_weight=0.7, min_p=0.1, exaggeration=0.9)
    assert np.array_equal(plain.wav, with_extras.wav)
    assert set(with_extras.ignored) == {"cfg_weight", "min_p", "exaggeration"}


@pytest.mark.fullsize
def test_long_text_is_split_into_chunks_with_consecutive_seeds(synth):
    text = "The first sentence is here. And a second one follows it."
    short_chunks = Synthesizer(synth.models, max_chars=30)
    short_chunks.short_voice = synth.short_voice
    result = _run(short_chunks, text=text)
    assert [c.text for c in result.chunks] == ["The first sentence is here.", "And a second one follows it."]
    assert [c.seed for c in result.chunks] == [5, 6]
    assert result.wav.shape == (2 * (N + SILENCE) * SAMPLES_PER_TOKEN,)
    # each chunk's audio is what that chunk alone gives with its seed
    second = _run(synth, text="And a second one follows it.", seed=6).wav
    assert np.array_equal(result.wav[(N + SILENCE) * SAMPLES_PER_TOKEN:], second)


@pytest.mark.fullsize
def test_voice_from_a_clip_and_from_its_saved_file_speak_alike(synth, tmp_path):
    clip = os.path.join(DATA_DIR, "sample-01.mp3")  # 5.7 s: Nano needs more than 5 s
    voice = synth.resolve_voice(clip)
    assert voice.t3_prompt_tokens.shape[1] == 143 and voice.name == "sample-01"
    from_clip = _run(synth, voice=clip).wav
    path = voice.save(tmp_path / "v.safetensors")
    from_file = _run(synth, voice=str(path)).wav
    assert np.array_equal(from_clip, from_file)
    assert not np.array_equal(from_clip, _run(synth).wav)


@pytest.mark.fullsize
def test_bad_requests_fail_before_any_model_runs(synth):
    with pytest.raises(TextInputError):
        synth.synthesize("   ")
    with pytest.raises(ValueError, match="flow_steps"):
        _run(synth, flow_steps=0)
    with pytest.raises(ValueError, match="unknown watermark"):
        _run(synth, watermark="nope")
    with pytest.raises(ValueError, match="top_p"):
        _run(synth, top_p=1.5)
    with pytest.raises(UnsupportedLanguageError):
        _run(synth, language="fr")
    with pytest.raises(ValueError, match="sample_rate"):
        synth.resolve_voice(np.zeros(24000 * 6, np.float32))


@pytest.mark.fullsize
def test_models_loaded_from_a_random_checkpoint_cap_unlimited_requests(synth):
    """The README's Python example on serve.sh's random checkpoint: capped as chorus synth is."""
    assert synth.models.random_weights
    plan = synth.planner.plan(SpeechRequest(TEXT))
    assert [c.params.max_new_tokens for c in plan.chunks] == [RANDOM_WEIGHTS_TOKEN_CAP]


def test_loading_a_random_checkpoint_warns_of_noise_and_the_cap(tmp_path, caplog):
    light = light_checkpoint("nano", tmp_path)  # empty weight files: loading fails after the warning
    with caplog.at_level("WARNING", logger="chorus.pipeline.models"), pytest.raises(ValueError):
        SpeechModels.load("nano", light, device="cpu")
    [warning] = [r.getMessage() for r in caplog.records if r.name == "chorus.pipeline.models"]
    assert "RANDOM WEIGHTS" in warning and "speaks noise" in warning
    assert f"without max_new_tokens stops at {RANDOM_WEIGHTS_TOKEN_CAP} speech tokens" in warning


@pytest.mark.fullsize
def test_text_ids_given_to_t3_are_unframed_for_framing_variants():
    checkpoint = Checkpoint(get_variant("nano"), shared_checkpoint("nano"))
    encoder = load_text_encoder(checkpoint.variant, checkpoint.directory)
    assert [ids for _, ids in plan_text(encoder, "Hi there.")] == [encoder.encode("Hi there.")]


@pytest.mark.fullsize
def test_flow_steps_change_the_audio(synth):
    assert not np.array_equal(_run(synth).wav, _run(synth, flow_steps=1).wav)
    assert torch.get_num_threads() <= 2


# ---- watermark ------------------------------------------------------------------------------------

@pytest.fixture
def fresh_watermarkers():
    from chorus import watermark

    watermark._cached.cache_clear()
    yield watermark
    watermark._cached.cache_clear()


def _fake_perth(monkeypatch, **attributes) -> None:
    module = types.ModuleType("perth")
    for name, value in attributes.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, "perth", module)


def test_real_perth_watermark_is_applied_and_detected(fresh_watermarkers):
    try:
        marker = fresh_watermarkers.get_watermarker("perth")
    except fresh_watermarkers.WatermarkUnavailableError as exc:
        pytest.skip(f"resemble-perth is not usable here: {exc}")
    speech = load_audio(os.path.join(DATA_DIR, "sample-01.mp3"), 24000).samples[: 24000 * 4]
    marked = marker.apply(speech, 24000)
    assert marked.dtype == np.float32 and marked.shape == speech.shape
    assert not np.array_equal(marked, speech)
    assert np.array_equal(marked, fresh_watermarkers.apply_watermark(speech, 24000, "perth"))  # deterministic
    assert marker.detect(marked, 24000) > 0.9 > 0.5 > marker.detect(speech, 24000)


def test_perth_with_a_failed_inner_import_is_detected(fresh_watermarkers, monkeypatch):
    # resemble-perth sets PerthImplicitWatermarker to None when e.g. pkg_resources is missing
    _fake_perth(monkeypatch, WatermarkerBase=type("WatermarkerBase", (), {}), PerthImplicitWatermarker=None)
    with pytest.raises(fresh_watermarkers.WatermarkUnavailableError, match="setuptools<82") as info:
        fresh_watermarkers.get_watermarker("perth")
    assert "failed to import" in str(info.value)


def test_a_perth_module_that_is_not_resemble_perth_is_refused(fresh_watermarkers, monkeypatch):
    _fake_perth(monkeypatch, PerthImplicitWatermarker=type("PerthImplicitWatermarker", (), {}))
    with pytest.raises(fresh_watermarkers.WatermarkUnavailableError, match="is not resemble-perth"):
        fresh_watermarkers.get_watermarker("perth")


def test_missing_perth_package_says_what_to_install(fresh_watermarkers, monkeypatch):
    monkeypatch.setitem(sys.modules, "perth", None)  # makes `import perth` raise ImportError
    with pytest.raises(fresh_watermarkers.WatermarkUnavailableError, match="resemble-perth==1.0.1"):
        fresh_watermarkers.get_watermarker("perth")


def test_watermark_names(fresh_watermarkers):
    assert fresh_watermarkers.get_watermarker(None) is None
    assert fresh_watermarkers.get_watermarker("none") is None
    wav = np.ones(10, np.float32)
    assert fresh_watermarkers.apply_watermark(wav, 24000, None) is wav
    with pytest.raises(ValueError, match="unknown watermark"):
        fresh_watermarkers.get_watermarker("audioseal")
