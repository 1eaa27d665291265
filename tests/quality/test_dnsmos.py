"""DNSMOS P.835 (chorus/quality/dnsmos.py, ``chorus-tts[quality]``): real speech scores above
noise, and the clip sent to the model is the start of the whole clip's 16 kHz copy. The sampler's
worker process: test_sampler.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("speechmos")

from chorus.audio import load_audio, resample  # noqa: E402
from chorus.quality.dnsmos import DNSMOS, MAX_WINDOWS, MODEL_RATE, WINDOW_SAMPLES, bucket, model_clip  # noqa: E402
from tests.conftest import DATA_DIR  # noqa: E402

RATE = 24_000


@pytest.fixture(scope="module")
def scorer() -> DNSMOS:
    return DNSMOS()


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return load_audio(os.path.join(DATA_DIR, "sample-01.mp3"), RATE).samples  # 5.7 s of a real voice


def test_real_speech_scores_above_noise(scorer, speech):
    noise = (0.1 * np.random.default_rng(0).standard_normal(speech.size)).astype(np.float32)
    clean, noisy = scorer.score(speech, RATE), scorer.score(noise, RATE)
    assert clean.ovrl > 3.0 and noisy.ovrl < 2.0
    assert clean.sig > noisy.sig + 1 and clean.bak > noisy.bak + 1


def test_speech_with_added_noise_scores_between(scorer, speech):
    rng = np.random.default_rng(1)
    noisy = (speech + 0.03 * rng.standard_normal(speech.size)).astype(np.float32)
    clean, degraded = scorer.score(speech, RATE), scorer.score(noisy, RATE)
    assert degraded.bak < clean.bak - 0.5 and 1.0 < degraded.ovrl < clean.ovrl


def test_buckets_name_their_upper_edge():
    assert [bucket(v, (0.0, 0.5, 1.0)) for v in (0.0, 0.3, 0.5, 0.9, 1.7)] == ["0", "0.5", "0.5", "1", "+Inf"]


def test_the_model_clip_of_a_long_request_is_the_start_of_its_whole_16k_copy(speech):
    """Only the scored span is resampled (and sent to the worker): the samples are those of
    resampling the whole request, so its score is too."""
    long = np.tile(speech, 8)  # 46 s, past the four windows scored
    clip = model_clip(long, RATE)
    assert clip.dtype == np.float32 and clip.size == MAX_WINDOWS * WINDOW_SAMPLES
    np.testing.assert_array_equal(clip, resample(np.clip(long, -1, 1), RATE, MODEL_RATE)[:clip.size])
