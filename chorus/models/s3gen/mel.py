"""Spectral front ends: the Slaney mel filterbank, length-aware reflect padding and the 24 kHz log-mel.

The 24 kHz log-mel is S3Gen's prompt feature (and the HiFT input format): 80 bins, 20 ms hop,
natural log. Everything here is plain PyTorch/NumPy; no audio library is needed at runtime.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_SLANEY_HZ_PER_MEL = 200.0 / 3.0
_SLANEY_LOG_START_HZ = 1000.0
_SLANEY_LOG_START_MEL = _SLANEY_LOG_START_HZ / _SLANEY_HZ_PER_MEL
_SLANEY_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    mel = hz / _SLANEY_HZ_PER_MEL
    above = hz >= _SLANEY_LOG_START_HZ
    mel[above] = _SLANEY_LOG_START_MEL + np.log(hz[above] / _SLANEY_LOG_START_HZ) / _SLANEY_LOG_STEP
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = _SLANEY_HZ_PER_MEL * mel
    above = mel >= _SLANEY_LOG_START_MEL
    hz[above] = _SLANEY_LOG_START_HZ * np.exp(_SLANEY_LOG_STEP * (mel[above] - _SLANEY_LOG_START_MEL))
    return hz


@functools.lru_cache(maxsize=16)
def _mel_filterbank_f32(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    bin_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    edge_mels = np.linspace(_hz_to_mel(np.array([fmin], dtype=np.float64))[0],
                            _hz_to_mel(np.array([fmax], dtype=np.float64))[0], n_mels + 2)
    edges_hz = _mel_to_hz(edge_mels)
    widths = np.diff(edges_hz)
    offsets = edges_hz[:, None] - bin_hz[None, :]
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    # The triangles are stored in float32 before the area normalisation (float64 factors), as
    # librosa does; doing both steps in float64 would differ from it in the last bit.
    weights = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    area_norm = 2.0 / (edges_hz[2:] - edges_hz[:-2])
    weights = (weights * area_norm[:, None]).astype(np.float32)
    weights.setflags(write=False)
    return weights


def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> torch.Tensor:
    """Slaney-scale, Slaney-normalised triangular mel filters, shape (n_mels, n_fft // 2 + 1), float32.

    Equal to ``librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)``
    with its defaults (``htk=False``, ``norm="slaney"``); ``fmax=None`` means ``sr / 2``.
    Returns a new CPU tensor each call (the underlying array is cached).
    """
    if fmax is None:
        fmax = sr / 2.0
    if not 0.0 <= fmin < fmax:
        raise ValueError(f"mel_filterbank needs 0 <= fmin < fmax, got fmin={fmin}, fmax={fmax}")
    return torch.from_numpy(_mel_filterbank_f32(int(sr), int(n_fft), int(n_mels), float(fmin), float(fmax)).copy())


def lengths_mask(lengths: torch.Tensor | None, max_len: int, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, 1, max_len) mask with ones on each item's first ``lengths[b]`` steps; None when ``lengths`` is None.

    No data-dependent branch (the mask is built whenever lengths are given), so a caller can
    capture it in a CUDA graph; callers that know no item is padded pass None instead.
    """
    if lengths is None:
        return None
    steps = torch.arange(max_len, device=lengths.device)
    return (steps[None, :] < lengths[:, None]).unsqueeze(1).to(dtype)


def reflect_pad(x: torch.Tensor, lengths: torch.Tensor | None, left: int, right: int) -> torch.Tensor:
    """Reflect-pad each row of ``x`` (B, L) as if it were ``lengths[b]`` samples long.

    Row b of the result holds, in its first ``lengths[b] + left + right`` entries, exactly what
    ``F.pad(row[:lengths[b]], (left, right), mode="reflect")`` gives; later entries are filler.
    ``lengths`` None means every row is all of L. Every length must exceed ``max(left, right)``
    (the caller checks: there is no host synchronisation here, so the call can be graph-captured).
    """
    assert x.dim() == 2
    if lengths is None:
        return F.pad(x.unsqueeze(1), (left, right), mode="reflect").squeeze(1)
    last = (lengths - 1)[:, None]
    pos = torch.arange(-left, x.shape[1] + right, device=x.device)[None, :]
    pos = torch.where(pos < 0, -pos, pos)
    pos = torch.where(pos > last, 2 * last - pos, pos)
    pos = torch.minimum(pos.clamp(min=0), last)
    return torch.gather(x, 1, pos)


@dataclass(frozen=True)
class MelConfig:
    """Parameters of a magnitude mel spectrogram with natural-log compression."""

    sample_rate: int = 24000
    n_fft: int = 1920
    hop: int = 480
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    magnitude_eps: float = 1e-9  # added to |X|^2 before the square root
    log_floor: float = 1e-5


S3GEN_MEL = MelConfig()


@functools.lru_cache(maxsize=8)
def _mel_constants(config: MelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    filters = mel_filterbank(config.sample_rate, config.n_fft, config.n_mels, config.fmin, config.fmax)
    return filters.to(device), torch.hann_window(config.n_fft, device=device)


def mel_num_frames(num_samples: torch.Tensor | int, config: MelConfig = S3GEN_MEL) -> torch.Tensor | int:
    """Number of mel frames for a waveform of ``num_samples`` samples (floor(L / hop))."""
    return num_samples // config.hop


def log_mel_spectrogram(
    wav: torch.Tensor, lengths: torch.Tensor | None = None, config: MelConfig = S3GEN_MEL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-mel of a batch of waveforms at ``config.sample_rate``: returns (mel (B, n_mels, T), frames (B,)).

    ``wav`` is (L,) or (B, L) float; ``lengths`` (B,) gives each item's sample count (default: all
    of L). Each item gets floor(length / hop) frames, the same values it would get alone; frames
    past an item's count are zero. Computed in float32 whatever the input dtype.
    """
    if wav.dim() == 1:
        wav = wav[None]
    if wav.dim() != 2:
        raise ValueError(f"expected a waveform of shape (L,) or (B, L), got {tuple(wav.shape)}")
    wav = wav.float()
    if lengths is None:
        lengths = torch.full((wav.shape[0],), wav.shape[1], dtype=torch.long, device=wav.device)
    lengths = lengths.to(device=wav.device, dtype=torch.long)
    side = (config.n_fft - config.hop) // 2
    if int(lengths.min()) <= side:
        raise ValueError(f"each waveform needs more than {side} samples, got lengths {lengths.tolist()}")
    padded_items = not bool((lengths >= wav.shape[1]).all())
    filters, window = _mel_constants(config, wav.device)
    padded = reflect_pad(wav, lengths if padded_items else None, side, side)
    spec = torch.stft(padded, config.n_fft, hop_length=config.hop, win_length=config.n_fft, window=window,
                      center=False, normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + config.magnitude_eps)
    mel = torch.log(torch.clamp(torch.matmul(filters, magnitude), min=config.log_floor))
    frames = mel_num_frames(lengths, config)
    mask = lengths_mask(frames, mel.shape[-1], mel.dtype) if padded_items else None
    return (mel if mask is None else mel * mask), frames
