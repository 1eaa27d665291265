"""Writing synthesized audio: WAV, FLAC and MP3 from mono float32 samples.

WAV and FLAC are 16-bit PCM (rounded to nearest by Chorus) through soundfile (libsndfile). MP3 goes through libsndfile too when it
was built with MP3 support (libsndfile >= 1.1.0), otherwise through PyAV's LAME encoder with the
server's settings (chorus.audio.streaming.encode_with_pyav, docs/audio-formats.md). Samples
are clipped to [-1, 1] first (the vocoder already limits itself to +-0.99).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import soundfile

from chorus.audio.pcm import to_pcm16

FORMATS = ("wav", "flac", "mp3")
_SOUNDFILE = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
_EXTENSIONS = {".wav": "wav", ".wave": "wav", ".flac": "flac", ".mp3": "mp3"}


class UnsupportedFormatError(ValueError):
    """An output format (or file extension) Chorus cannot write."""


def format_from_path(path: str | os.PathLike) -> str:
    """``"wav" | "flac" | "mp3"`` from a file name's extension."""
    suffix = Path(path).suffix.lower()
    if suffix not in _EXTENSIONS:
        raise UnsupportedFormatError(
            f"cannot tell the audio format of {os.fspath(path)!r}: use a .wav, .flac or .mp3 file name")
    return _EXTENSIONS[suffix]


def _check(wav: np.ndarray, sample_rate: int, fmt: str) -> np.ndarray:
    if fmt not in FORMATS:
        raise UnsupportedFormatError(f"unsupported audio format {fmt!r}; choose one of {', '.join(FORMATS)}")
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {wav.shape}")
    if not isinstance(sample_rate, int) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    if wav.size and not np.isfinite(wav).all():
        raise ValueError("the audio contains NaN or infinite samples")
    return np.clip(wav, -1.0, 1.0)


def soundfile_writes_mp3() -> bool:
    """Whether the installed libsndfile can encode MP3."""
    return "MP3" in soundfile.available_formats()


def encode_audio(wav: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode mono float samples as a complete ``fmt`` file in memory."""
    wav = _check(wav, sample_rate, fmt)
    if fmt == "mp3" and not soundfile_writes_mp3():
        return _mp3_with_pyav(wav, sample_rate)
    container, subtype = _SOUNDFILE[fmt]
    data = to_pcm16(wav) if subtype == "PCM_16" else wav
    buffer = io.BytesIO()
    soundfile.write(buffer, data, sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()


def write_audio(path: str | os.PathLike, wav: np.ndarray, sample_rate: int, fmt: str | None = None) -> Path:
    """Write ``wav`` to ``path`` (atomically: a temporary name, then a rename); the format comes
    from the extension unless ``fmt`` is given."""
    fmt = fmt or format_from_path(path)
    from chorus.atomic import atomic_write_bytes

    data = encode_audio(wav, sample_rate, fmt)
    return atomic_write_bytes(path, data)  # an interrupted run leaves no half-written file


def _mp3_with_pyav(wav: np.ndarray, sample_rate: int) -> bytes:
    from chorus.audio.streaming import encode_with_pyav  # the server's encoder settings, one PyAV path

    return encode_with_pyav(wav, sample_rate, "mp3")
