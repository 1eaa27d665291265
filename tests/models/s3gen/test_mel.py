"""The Slaney mel filterbank and S3Gen's 24 kHz log-mel (prompt features) against librosa and the reference."""
from __future__ import annotations

import math
import os

import pytest
import torch

from chorus.models.s3gen.mel import log_mel_spectrogram, mel_filterbank, reflect_pad

DATA_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "data")
FILTERBANK_CASES = [
    (24000, 1920, 80, 0.0, 8000.0),  # S3Gen prompt mel
    (16000, 400, 128, 0.0, None),  # S3 tokenizer
    (16000, 400, 40, 0.0, 8000.0),  # voice encoder
    (22050, 1024, 80, 30.0, 7600.0),  # non-zero fmin, odd sample rate
]


@pytest.fixture(scope="module")
def librosa():
    return pytest.importorskip("librosa")


@pytest.fixture(scope="module")
def speech_24k() -> torch.Tensor:
    soundfile = pytest.importorskip("soundfile")
    wav, sample_rate = soundfile.read(os.path.join(DATA_DIR, "sample-01.mp3"), dtype="float32")
    assert sample_rate == 24000  # stored at S3Gen's rate, so no resampling is needed
    return torch.from_numpy(wav)


def synthetic_signals() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(37_113) / 24000  # not a multiple of the hop
    chirp = 0.5 * torch.sin(2 * math.pi * (50 * t + 2000 * t ** 2))
    noise = 0.3 * torch.randn(t.shape, generator=g)
    mixed = torch.cat([torch.zeros(5000), chirp[:20000] + 0.05 * noise[:20000], torch.full((3000,), 0.2)])
    return {"chirp": chirp, "noise": noise, "silence_and_dc": mixed, "short": noise[:961]}


@pytest.mark.parametrize("sr,n_fft,n_mels,fmin,fmax", FILTERBANK_CASES)
def test_mel_filterbank_matches_librosa(librosa, sr, n_fft, n_mels, fmin, fmax):
    expected = torch.from_numpy(librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax))
    ours = mel_filterbank(sr, n_fft, n_mels, fmin, fmax)
    assert ours.dtype == torch.float32 and ours.shape == expected.shape
    assert (ours - expected).abs().max().item() <= 1e-7


def test_mel_filterbank_rejects_inverted_band():
    with pytest.raises(ValueError):
        mel_filterbank(24000, 1920, 80, fmin=9000.0, fmax=8000.0)


@pytest.mark.oracle
def test_mel_matches_reference_on_speech(oracle, speech_24k):
    from chatterbox.models.s3gen.utils.mel import mel_spectrogram

    expected = mel_spectrogram(speech_24k[None].clone())
    ours, frames = log_mel_spectrogram(speech_24k)
    assert ours.shape == expected.shape and frames.tolist() == [speech_24k.numel() // 480]
    assert (ours - expected).abs().max().item() <= 1e-4


@pytest.mark.oracle
@pytest.mark.parametrize("name", list(synthetic_signals()))
def test_mel_matches_reference_on_synthetic_signals(oracle, name):
    from chatterbox.models.s3gen.utils.mel import mel_spectrogram

    wav = synthetic_signals()[name]
    expected = mel_spectrogram(wav[None].clone())
    ours, _ = log_mel_spectrogram(wav)
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max().item() <= 1e-4


def test_mel_of_padded_batch_equals_each_item_alone(speech_24k):
    lengths = [speech_24k.numel(), 30_000, 12_345, 961]
    batch = torch.randn(len(lengths), max(lengths)) * 5  # loud filler: must not leak into real frames
    for i, n in enumerate(lengths):
        batch[i, :n] = speech_24k[:n]
    mel, frames = log_mel_spectrogram(batch, torch.tensor(lengths))
    for i, n in enumerate(lengths):
        alone, alone_frames = log_mel_spectrogram(speech_24k[:n])
        assert frames[i].item() == alone_frames.item() == n // 480
        assert (mel[i, :, : frames[i]] - alone[0]).abs().max().item() <= 1e-5
        assert mel[i, :, frames[i]:].abs().sum().item() == 0.0  # frames past the item are zero


def test_mel_rejects_waveform_shorter_than_reflect_pad():
    with pytest.raises(ValueError):
        log_mel_spectrogram(torch.zeros(700))


def test_reflect_pad_per_item_equals_unbatched_reflect_pad():
    x = torch.randn(3, 20)
    lengths = torch.tensor([20, 9, 13])
    padded = reflect_pad(x, lengths, 4, 5)
    for i, n in enumerate(lengths.tolist()):
        alone = torch.nn.functional.pad(x[i:i + 1, None, :n], (4, 5), mode="reflect")[0, 0]
        assert torch.equal(padded[i, : n + 9], alone)
