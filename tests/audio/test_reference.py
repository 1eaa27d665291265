"""Reference-clip preparation: the reference's load/normalise/resample chain plus Chorus's checks."""
from __future__ import annotations

import os

import numpy as np
import pytest
import soundfile

from chorus.audio import (
    DecodedAudio, ReferenceAudioError, ReferencePolicy, load_audio, normalize_loudness, prepare_reference, resample,
)
from chorus.models.variants import get_variant
from tests.conftest import DATA_DIR

FLAC = os.path.join(DATA_DIR, "sample-01-02.flac")  # 9.8 s
SHORT_MP3 = os.path.join(DATA_DIR, "sample-02.mp3")  # 3.8 s
TURBO = ReferencePolicy.for_variant(get_variant("turbo"))
ORIGINAL = ReferencePolicy.for_variant(get_variant("original"))


def _speech_24k(seconds: float) -> DecodedAudio:
    speech = load_audio(FLAC, 24000).samples
    reps = int(np.ceil(seconds * 24000 / len(speech)))
    return DecodedAudio(np.tile(speech, reps)[: int(round(seconds * 24000))], 24000)


def test_original_variant_keeps_level_and_makes_a_soxr_16k_copy():
    ref = prepare_reference(FLAC, ORIGINAL)
    expected = load_audio(FLAC, 24000).samples
    np.testing.assert_array_equal(ref.wav_24k, expected)
    np.testing.assert_array_equal(ref.wav_16k, resample(expected, 24000, 16000))
    assert ref.measured_lufs is None and not ref.truncated


def test_turbo_variant_normalizes_to_minus_27_lufs_before_the_16k_copy():
    ref = prepare_reference(FLAC, TURBO)
    expected = normalize_loudness(load_audio(FLAC, 24000).samples, 24000, -27.0)
    np.testing.assert_array_equal(ref.wav_24k, expected)
    np.testing.assert_array_equal(ref.wav_16k, resample(expected, 24000, 16000))
    assert ref.measured_lufs == pytest.approx(-17.69, abs=0.01)


def test_prompt_slices_follow_the_variant():
    ref = prepare_reference(_speech_24k(20.0), TURBO)
    assert len(ref.s3gen_prompt_24k) == 240000 and len(ref.t3_prompt_16k) == 240000
    ref = prepare_reference(_speech_24k(20.0), ORIGINAL)
    assert len(ref.s3gen_prompt_24k) == 240000 and len(ref.t3_prompt_16k) == 96000


@pytest.mark.parametrize("seconds,ok", [(4.9, False), (5.0, False), (5.05, True)])
def test_turbo_needs_more_than_five_seconds(seconds, ok):
    clip = _speech_24k(seconds)
    if ok:
        assert prepare_reference(clip, TURBO).duration == pytest.approx(seconds)
    else:
        with pytest.raises(ReferenceAudioError, match="turbo variant needs more than 5 s") as err:
            prepare_reference(clip, TURBO)
        assert err.value.reason == "too_short"


def test_original_accepts_a_short_clip():
    assert prepare_reference(SHORT_MP3, ORIGINAL).duration == pytest.approx(3.8, abs=0.01)


def test_clip_below_the_global_floor_is_rejected():
    with pytest.raises(ReferenceAudioError, match="at least 0.5 s") as err:
        prepare_reference(_speech_24k(0.3), ORIGINAL)
    assert err.value.reason == "too_short"


def test_empty_file_is_rejected(tmp_path):
    path = tmp_path / "empty.wav"
    soundfile.write(path, np.zeros(0, np.float32), 16000)
    with pytest.raises(ReferenceAudioError, match="no audio samples") as err:
        prepare_reference(path, ORIGINAL)
    assert err.value.reason == "empty"


@pytest.mark.parametrize("peak", [0.0, 5e-4])
def test_silent_clip_is_rejected(peak):
    rng = np.random.default_rng(0)
    wav = (peak * np.clip(rng.standard_normal(6 * 16000), -1, 1)).astype(np.float32)
    with pytest.raises(ReferenceAudioError, match="silent") as err:
        prepare_reference(DecodedAudio(wav, 16000), TURBO)
    assert err.value.reason == "silent"


def test_quiet_but_audible_clip_is_accepted_and_normalized():
    quiet = _speech_24k(6.0)
    quiet = DecodedAudio(quiet.samples * (0.003 / np.abs(quiet.samples).max()), 24000)
    ref = prepare_reference(quiet, TURBO)
    assert ref.measured_lufs < -50
    np.testing.assert_array_equal(ref.wav_24k, normalize_loudness(quiet.samples, 24000, -27.0))


def test_long_clip_is_cut_to_max_seconds_and_flagged(tmp_path):
    path = tmp_path / "long.wav"
    soundfile.write(path, _speech_24k(25.0).samples, 24000)
    policy = ReferencePolicy.for_variant(get_variant("original"), max_seconds=12.0)
    ref = prepare_reference(path, policy)
    assert ref.truncated and ref.duration == pytest.approx(12.0)
    ref = prepare_reference(_speech_24k(25.0), policy)  # already-decoded input takes the same path
    assert ref.truncated and ref.duration == pytest.approx(12.0)
