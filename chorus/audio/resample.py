"""Resampling.

Two resamplers, because the reference uses two and their outputs differ:

- :func:`resample` (soxr, "HQ" quality) reproduces ``librosa.resample(res_type="soxr_hq")``, which
  the reference uses to load clips at 24 kHz and to make the 16 kHz copy for T3 and the
  VoiceEncoder.
- :class:`SincResampler` reproduces ``torchaudio.transforms.Resample`` (windowed-sinc, Hann window,
  6 zero crossings, roll-off 0.99), which S3Gen's ``embed_ref`` uses for its own 16 kHz copy (the
  CAMPPlus x-vector and the S3Gen prompt tokens). It runs in torch, batched, on any device.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import soxr
import torch


def resample(wav: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Resample mono float audio with soxr HQ; the output has ``ceil(len * target / orig)`` samples."""
    assert wav.ndim == 1, "resample expects mono audio"
    if orig_sr == target_sr:
        return wav
    out = soxr.resample(wav, orig_sr, target_sr, quality="HQ")
    # librosa pins the output length to ceil(n * ratio) (soxr may be off by one sample)
    target_len = int(np.ceil(len(wav) * (float(target_sr) / orig_sr)))
    if len(out) > target_len:
        out = out[:target_len]
    elif len(out) < target_len:
        out = np.pad(out, (0, target_len - len(out)))
    return np.asarray(out, dtype=wav.dtype)


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> tuple[torch.Tensor, int]:
    """Polyphase windowed-sinc kernel (new, 1, taps) for rates already divided by their gcd.

    Built in float64 and stored as float32, as torchaudio's transform does.
    """
    cutoff = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / cutoff)
    # Input taps relative to each output phase, in units of input samples / orig.
    taps = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    phases = torch.arange(0, -new, -1, dtype=torch.float32)[:, None, None] / new
    t = (phases + taps) * cutoff
    t = t.clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones((), dtype=t.dtype), t.sin() / t)
    kernel = sinc * (window * (cutoff / orig))
    return kernel.to(torch.float32), width


class SincResampler:
    """torchaudio-compatible band-limited resampler between two integer rates.

    Call it on a (..., time) float tensor; the result has ``ceil(time * new / orig)`` samples.
    """

    def __init__(self, orig_sr: int, target_sr: int, lowpass_filter_width: int = 6, rolloff: float = 0.99):
        assert orig_sr > 0 and target_sr > 0
        gcd = math.gcd(int(orig_sr), int(target_sr))
        self.orig = int(orig_sr) // gcd
        self.new = int(target_sr) // gcd
        self.kernel, self.width = _sinc_kernel(self.orig, self.new, lowpass_filter_width, rolloff)

    def __call__(self, wav: torch.Tensor) -> torch.Tensor:
        if self.orig == self.new:
            return wav
        if not wav.is_floating_point():
            raise TypeError(f"expected a floating-point waveform, got {wav.dtype}")
        shape = wav.shape
        flat = wav.reshape(-1, shape[-1])
        length = flat.shape[-1]
        padded = torch.nn.functional.pad(flat, (self.width, self.width + self.orig))
        kernel = self.kernel.to(device=wav.device, dtype=wav.dtype)
        out = torch.nn.functional.conv1d(padded[:, None], kernel, stride=self.orig)
        out = out.transpose(1, 2).reshape(flat.shape[0], -1)
        target_len = math.ceil(self.new * length / self.orig)
        return out[:, :target_len].reshape(*shape[:-1], -1)


class StreamResampler:
    """soxr HQ over a stream of mono float32 pieces (e.g. 24 kHz speech to 16 or 8 kHz for
    telephony): :meth:`process` returns the samples ready so far, :meth:`flush` the rest. The
    whole output has ``round(n * target / orig)`` samples for ``n`` in, however it was split."""

    def __init__(self, orig_sr: int, target_sr: int):
        assert orig_sr > 0 and target_sr > 0
        self._stream = soxr.ResampleStream(orig_sr, target_sr, 1, dtype="float32", quality="HQ")

    def process(self, samples: np.ndarray) -> np.ndarray:
        return self._stream.resample_chunk(np.ascontiguousarray(samples, dtype=np.float32))

    def flush(self) -> np.ndarray:
        return self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
