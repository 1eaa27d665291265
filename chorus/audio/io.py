"""Decoding audio files and byte strings to mono float32.

soundfile (libsndfile) is tried first: it covers WAV/FLAC/OGG-Vorbis/Opus/MP3 and many more and is
what the reference's ``librosa.load`` uses, so samples match the reference bit for bit. Containers
libsndfile cannot read (m4a/AAC, webm, ...) fall back to PyAV (FFmpeg) when it is installed.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import BinaryIO, Union

import numpy as np
import soundfile

from chorus.audio.errors import AudioDecodeError
from chorus.audio.resample import resample

AudioSource = Union[str, os.PathLike, bytes, bytearray, BinaryIO]


@dataclass(frozen=True)
class DecodedAudio:
    """Mono float32 samples at the file's own sample rate."""

    samples: np.ndarray  # (num_samples,) float32
    sample_rate: int
    truncated: bool = False  # True when ``max_seconds`` cut the file short

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate


def decode_audio(source: AudioSource, *, max_seconds: float | None = None) -> DecodedAudio:
    """Decode ``source`` (path, bytes or binary file object) to mono float32.

    Channels are averaged. ``max_seconds`` bounds how much is decoded (the rest of the file is not
    read). Raises ``FileNotFoundError`` for a missing path and :class:`AudioDecodeError` when
    neither decoder can read the data or the samples are not finite.
    """
    if isinstance(source, (str, os.PathLike)) and not os.path.exists(source):
        raise FileNotFoundError(f"audio file not found: {os.fspath(source)}")
    if isinstance(source, (bytes, bytearray)) and len(source) == 0:
        raise AudioDecodeError("the audio data is empty (0 bytes)")
    max_frames_at = (lambda sr: -1) if max_seconds is None else (lambda sr: int(max_seconds * sr))
    try:
        samples, sample_rate, truncated = _decode_with_soundfile(source, max_frames_at)
    except (soundfile.SoundFileError, RuntimeError, TypeError) as sf_error:
        samples, sample_rate, truncated = _decode_with_pyav(source, max_seconds, sf_error)
    if samples.size and not np.isfinite(samples).all():
        raise AudioDecodeError("the audio contains NaN or infinite sample values")
    return DecodedAudio(samples=samples, sample_rate=sample_rate, truncated=truncated)


def load_audio(source: AudioSource, sample_rate: int, *, max_seconds: float | None = None) -> DecodedAudio:
    """Decode ``source`` and resample it to ``sample_rate`` (soxr HQ, like ``librosa.load(sr=...)``)."""
    decoded = decode_audio(source, max_seconds=max_seconds)
    if decoded.sample_rate == sample_rate:
        return decoded
    return DecodedAudio(
        samples=resample(decoded.samples, decoded.sample_rate, sample_rate),
        sample_rate=sample_rate, truncated=decoded.truncated,
    )


def _as_file(source: AudioSource):
    if isinstance(source, (bytes, bytearray)):
        return io.BytesIO(bytes(source))
    if hasattr(source, "seek"):
        source.seek(0)
    return source


def _decode_with_soundfile(source: AudioSource, max_frames_at) -> tuple[np.ndarray, int, bool]:
    with soundfile.SoundFile(_as_file(source)) as f:
        limit = max_frames_at(f.samplerate)
        data = f.read(frames=limit, dtype="float32", always_2d=True)
        # A file whose header does not report its length (e.g. some MP3s) reports frames == 0.
        truncated = limit >= 0 and data.shape[0] == limit and (f.frames == 0 or f.frames > limit)
        return _to_mono(data), int(f.samplerate), truncated


def _decode_with_pyav(source: AudioSource, max_seconds: float | None, sf_error: Exception):
    try:
        import av
    except ImportError:
        raise AudioDecodeError(
            f"could not decode the audio ({sf_error}); install PyAV (`pip install av`) to read "
            "formats libsndfile does not support, such as m4a/AAC or webm"
        ) from sf_error
    try:
        with av.open(_as_file(source), mode="r") as container:
            if not container.streams.audio:
                raise AudioDecodeError("could not decode the audio: the file contains no audio stream")
            stream = container.streams.audio[0]
            sample_rate = int(stream.codec_context.sample_rate or stream.rate)
            limit = None if max_seconds is None else int(max_seconds * sample_rate)
            # Convert every frame to planar float32 at the native rate and channel layout.
            to_float = av.AudioResampler(format="fltp")
            chunks, total, truncated = [], 0, False
            for frame in container.decode(stream):
                for converted in to_float.resample(frame):
                    chunk = converted.to_ndarray()  # (channels, samples)
                    chunks.append(chunk)
                    total += chunk.shape[1]
                if limit is not None and total >= limit:
                    truncated = True
                    break
            if not truncated:
                chunks.extend(c.to_ndarray() for c in to_float.resample(None))
    except AudioDecodeError:
        raise
    except Exception as exc:  # PyAV raises many error types (InvalidDataError, ValueError, ...)
        raise AudioDecodeError(
            f"could not decode the audio: not a supported audio format, or the data is corrupt or "
            f"truncated (libsndfile: {sf_error}; FFmpeg: {exc})"
        ) from exc
    if not chunks:
        return np.zeros(0, dtype=np.float32), sample_rate, False
    data = np.concatenate(chunks, axis=1).T  # (samples, channels)
    if limit is not None:
        truncated = truncated and data.shape[0] > limit
        data = data[:limit]
    return _to_mono(np.ascontiguousarray(data, dtype=np.float32)), sample_rate, truncated


def _to_mono(data: np.ndarray) -> np.ndarray:
    """(samples, channels) -> (samples,), averaging channels the way librosa.to_mono does."""
    if data.shape[1] == 1:
        return np.ascontiguousarray(data[:, 0])
    return np.mean(data, axis=1).astype(np.float32, copy=False)
