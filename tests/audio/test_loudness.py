"""BS.1770 integrated loudness and -27 LUFS normalisation match pyloudnorm."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from chorus.audio import integrated_loudness, load_audio, normalize_loudness
from tests.conftest import DATA_DIR


def _cases() -> dict[str, tuple[np.ndarray, int]]:
    rng = np.random.default_rng(0)
    cases = {}
    for name in ["sample-01.mp3", "sample-02.mp3", "sample-01-02.flac"]:
        cases[name] = (load_audio(os.path.join(DATA_DIR, name), 24000).samples, 24000)
    t = np.arange(3 * 48000) / 48000
    cases["tone-48k"] = ((0.25 * np.sin(2 * np.pi * 997 * t)).astype(np.float32), 48000)
    cases["noise-16k"] = ((0.05 * rng.standard_normal(5 * 16000)).astype(np.float32), 16000)
    speech = cases["sample-02.mp3"][0]
    # quiet passages exercise both gates; 0.123 s of extra samples leaves a partial final block
    quiet = np.concatenate([1e-4 * speech, speech, 0.02 * speech, np.zeros(2952, np.float32)])
    cases["gated-speech"] = (quiet, 24000)
    return cases


def test_integrated_loudness_matches_pyloudnorm():
    pyln = pytest.importorskip("pyloudnorm")
    for name, (wav, rate) in _cases().items():
        expected = pyln.Meter(rate).integrated_loudness(wav)
        assert integrated_loudness(wav, rate) == pytest.approx(expected, abs=0.01), name


def test_normalized_clip_measures_target_with_pyloudnorm():
    pyln = pytest.importorskip("pyloudnorm")
    for name, (wav, rate) in _cases().items():
        out = normalize_loudness(wav, rate, -27.0)
        assert out.dtype == wav.dtype
        assert pyln.Meter(rate).integrated_loudness(out) == pytest.approx(-27.0, abs=0.01), name


@pytest.mark.oracle
def test_normalization_matches_reference_turbo_helper(oracle):
    from chatterbox.tts_turbo import ChatterboxTurboTTS

    for name, (wav, rate) in _cases().items():
        expected = ChatterboxTurboTTS.norm_loudness(None, wav.copy(), rate, target_lufs=-27)
        got = normalize_loudness(wav, rate, -27.0)
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-7, err_msg=name)


def test_silence_measures_minus_infinity_and_is_left_unchanged():
    wav = np.zeros(24000, np.float32)
    assert integrated_loudness(wav, 24000) == -math.inf
    assert normalize_loudness(wav, 24000, -27.0) is wav


def test_clip_shorter_than_one_block_is_left_unchanged():
    wav = np.full(9000, 0.1, np.float32)  # 0.375 s at 24 kHz
    with pytest.raises(ValueError):
        integrated_loudness(wav, 24000)
    assert normalize_loudness(wav, 24000, -27.0) is wav
