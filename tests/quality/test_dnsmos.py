"""DNSMOS P.835 (chorus/quality/dnsmos.py, ``chorus-tts[quality]``): real speech scores above
noise, and the sampler's queue is bounded."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("speechmos")

from chorus.audio import load_audio  # noqa: E402
from chorus.quality.dnsmos import DNSMOS, Job, QualitySampler, bucket  # noqa: E402
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


def test_a_full_queue_skips_instead_of_blocking(scorer, speech):
    scored, skipped = [], []
    done = threading.Event()

    def observe(job, scores, seconds):
        scored.append(job.request_id)
        if len(scored) == 2:
            done.set()

    sampler = QualitySampler(1.0, observe, lambda: skipped.append(1), capacity=2, scorer=scorer)
    long = np.tile(speech, 6)  # 34 s: seconds of scoring each, while 20 offers take microseconds
    for i in range(20):
        sampler.offer(Job(long, RATE, 0.5, 0.5, f"r{i}"))
    assert len(skipped) >= 15  # two queued, at most a few taken by the worker meanwhile
    assert done.wait(120)
    sampler.close()
    assert scored[:2] == ["r0", "r1"]
