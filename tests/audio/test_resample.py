"""soxr resampling matches librosa; the sinc resampler matches torchaudio's Resample."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from chorus.audio import SincResampler, load_audio, resample
from tests.conftest import DATA_DIR


def _signals(sample_rate: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(int(2.3 * sample_rate)) / sample_rate
    speech = load_audio(os.path.join(DATA_DIR, "sample-02.mp3"), sample_rate).samples
    return {
        "speech": speech,
        "tone": (0.5 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 7000 * t)).astype(np.float32),
        "noise": (0.1 * rng.standard_normal(len(t))).astype(np.float32),
        "silence-padded": np.concatenate([np.zeros(sample_rate, np.float32), speech, np.zeros(777, np.float32)]),
    }


@pytest.mark.parametrize("orig,target", [(24000, 16000), (44100, 24000), (16000, 24000)])
def test_soxr_resample_matches_librosa(orig, target):
    librosa = pytest.importorskip("librosa")
    for name, wav in _signals(orig).items():
        expected = librosa.resample(wav, orig_sr=orig, target_sr=target)
        got = resample(wav, orig, target)
        np.testing.assert_array_equal(got, expected, err_msg=name)


@pytest.mark.parametrize("orig,target", [(24000, 16000), (16000, 24000), (44100, 16000)])
def test_sinc_resampler_matches_torchaudio(orig, target):
    transforms = pytest.importorskip("torchaudio.transforms")
    reference = transforms.Resample(orig, target)
    ours = SincResampler(orig, target)
    worst = 0.0
    for name, wav in _signals(orig).items():
        x = torch.from_numpy(wav)[None]
        expected, got = reference(x), ours(x)
        assert got.shape == expected.shape, name
        worst = max(worst, (got - expected).abs().max().item())
    assert worst <= 1e-6


def test_sinc_resampler_keeps_leading_dims_and_length_rule():
    wav = torch.randn(2, 2, 24001)
    out = SincResampler(24000, 16000)(wav)
    assert out.shape == (2, 2, 16001)  # ceil(24001 * 2 / 3)
    torch.testing.assert_close(out[1, 1], SincResampler(24000, 16000)(wav[1, 1]), rtol=0, atol=1e-6)


def test_resample_to_same_rate_is_identity():
    wav = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert resample(wav, 16000, 16000) is wav
    assert torch.equal(SincResampler(16000, 16000)(torch.from_numpy(wav)), torch.from_numpy(wav))
