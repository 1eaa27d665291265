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

from chorus.audio.errors import AudioDecodeError, AudioTooLongError
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

    @classmethod
    def from_array(cls, samples, sample_rate: int | None, what: str) -> "DecodedAudio":
        """A waveform given as an array, mono ``(samples,)`` or ``(samples, channels)`` as
        soundfile returns it (channels averaged). ``what`` names it in the errors, e.g. "a source"."""
        if sample_rate is None:
            raise ValueError(f"{what} given as an array needs its sample_rate")
        mono = np.asarray(samples, dtype=np.float32)
        if mono.ndim == 2:
            mono = mono.mean(axis=1, dtype=np.float32)
        if mono.ndim != 1:
            raise ValueError(f"{what} array must be mono (samples,) or (samples, channels), got {np.shape(samples)}")
        return cls(np.ascontiguousarray(mono), int(sample_rate))


MAX_SAMPLE_RATE = 384_000  # above any real recording: a larger rate is a hostile or broken header
_BLOCK_FRAMES = 1 << 16


def decode_audio(source: AudioSource, *, max_seconds: float | None = None,
                 refuse_seconds: float | None = None) -> DecodedAudio:
    """Decode ``source`` (path, bytes or binary file object) to mono float32.

    Channels are averaged block by block (memory holds mono samples only). ``max_seconds``
    bounds what is kept (the file is cut there, ``truncated``). ``refuse_seconds`` bounds what is
    accepted at all: a longer file raises :class:`AudioTooLongError`, judged from the header
    when it states a length (nothing is decoded) and otherwise by decoding, which stops just
    past the limit, so a decompression bomb costs at most ``refuse_seconds`` of decoding.
    Raises ``FileNotFoundError`` for a missing path and :class:`AudioDecodeError` when neither
    decoder can read the data, the sample rate is over :data:`MAX_SAMPLE_RATE`, or the samples
    are not finite.
    """
    if isinstance(source, (str, os.PathLike)) and not os.path.exists(source):
        raise FileNotFoundError(f"audio file not found: {os.fspath(source)}")
    if isinstance(source, (bytes, bytearray)) and len(source) == 0:
        raise AudioDecodeError("the audio data is empty (0 bytes)")
    limits = _Limits(max_seconds, refuse_seconds)
    try:
        samples, sample_rate, truncated = _decode_with_soundfile(source, limits)
    except (soundfile.SoundFileError, RuntimeError, TypeError) as sf_error:
        samples, sample_rate, truncated = _decode_with_pyav(source, limits, sf_error)
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


@dataclass(frozen=True)
class _Limits:
    keep_s: float | None  # samples past this are dropped (the result is truncated)
    refuse_s: float | None  # a source past this is refused

    def check_rate(self, sample_rate: int) -> None:
        if not 0 < sample_rate <= MAX_SAMPLE_RATE:
            raise AudioDecodeError(f"could not decode the audio: a sample rate of {sample_rate} Hz is not "
                                   f"supported (at most {MAX_SAMPLE_RATE})")

    def check_length(self, seconds: float, *, declared: bool) -> None:
        if self.refuse_s is not None and seconds > self.refuse_s:
            how = "its header says it lasts" if declared else "it lasts more than"
            raise AudioTooLongError(f"the audio is too long: {how} {seconds:.0f} s; the limit is "
                                    f"{self.refuse_s:g} s")

    def keep_frames(self, sample_rate: int) -> int | None:
        return None if self.keep_s is None else int(self.keep_s * sample_rate)


class _Collector:
    """Mono blocks kept up to the keep limit; every decoded frame counted against the refusal."""

    def __init__(self, limits: _Limits, sample_rate: int):
        self.limits, self.rate = limits, sample_rate
        self.keep = limits.keep_frames(sample_rate)
        self.blocks: list[np.ndarray] = []
        self.kept = self.seen = 0

    def add(self, mono: np.ndarray) -> bool:
        """Take one block; False once nothing more needs decoding."""
        self.seen += mono.shape[0]
        self.limits.check_length(self.seen / self.rate, declared=False)
        if self.keep is None or self.kept < self.keep:
            part = mono if self.keep is None else mono[: self.keep - self.kept]
            self.blocks.append(part)
            self.kept += part.shape[0]
        return self.limits.refuse_s is not None or self.keep is None or self.seen <= self.keep

    def result(self) -> tuple[np.ndarray, bool]:
        samples = np.concatenate(self.blocks) if self.blocks else np.zeros(0, dtype=np.float32)
        return np.ascontiguousarray(samples, dtype=np.float32), self.seen > self.kept


def _decode_with_soundfile(source: AudioSource, limits: _Limits) -> tuple[np.ndarray, int, bool]:
    with soundfile.SoundFile(_as_file(source)) as f:
        rate = int(f.samplerate)
        limits.check_rate(rate)
        stated = 0 < f.frames < 1 << 62  # libsndfile says 0 or 2^63 - 1 when the header does not tell
        if stated:  # a stated length is judged before anything is decoded
            limits.check_length(f.frames / rate, declared=True)
        keep = limits.keep_frames(rate)
        refuse = None if limits.refuse_s is None else int(limits.refuse_s * rate) + 1
        # what is kept is read in one call, as the reference reads it (libsndfile's MP3 decoder
        # gives slightly different samples when read in pieces); the rest only counted, by blocks
        first = keep if keep is not None else (refuse if refuse is not None else -1)
        collector = _Collector(limits, rate)
        data = f.read(frames=first, dtype="float32", always_2d=True)
        collector.add(_to_mono(data))
        if refuse is None or data.shape[0] < first:
            truncated = keep is not None and data.shape[0] == keep and (not stated or f.frames > keep)
            return collector.result()[0], rate, truncated
        for block in f.blocks(blocksize=_BLOCK_FRAMES, dtype="float32", always_2d=True):
            collector.add(_to_mono(block))  # raises once past the refusal limit
        samples, truncated = collector.result()
        return samples, rate, truncated


def _decode_with_pyav(source: AudioSource, limits: _Limits, sf_error: Exception):
    try:
        import av
    except ImportError:
        raise AudioDecodeError(
            f"{_not_decodable(with_ffmpeg=False)}; install PyAV (`pip install av`) to read formats libsndfile "
            "does not, such as m4a/AAC or webm"
        ) from sf_error
    try:
        with av.open(_as_file(source), mode="r") as container:
            if not container.streams.audio:
                raise AudioDecodeError("could not decode the audio: the file contains no audio stream")
            stream = container.streams.audio[0]
            sample_rate = int(stream.codec_context.sample_rate or stream.rate)
            limits.check_rate(sample_rate)
            if container.duration:  # microseconds, when the container states it
                limits.check_length(container.duration / 1_000_000, declared=True)
            collector = _Collector(limits, sample_rate)
            # Convert every frame to planar float32 at the native rate and channel layout.
            to_float = av.AudioResampler(format="fltp")
            going = True
            for frame in container.decode(stream):
                for converted in to_float.resample(frame):
                    going = collector.add(_to_mono(converted.to_ndarray().T))  # (samples, channels)
                if not going:
                    break
            if going:
                for converted in to_float.resample(None):
                    collector.add(_to_mono(converted.to_ndarray().T))
    except AudioDecodeError:
        raise
    except Exception as exc:  # PyAV raises many error types (InvalidDataError, ValueError, ...)
        # the decoders' own words name buffers and error numbers, not the user's file: they stay
        # in the exception chain (__cause__, __context__) for whoever debugs
        raise AudioDecodeError(f"{_not_decodable(with_ffmpeg=True)}, or the data is corrupt or truncated") from exc
    samples, truncated = collector.result()
    return samples, sample_rate, truncated


# the formats named first in the error for data that no decoder reads, as libsndfile spells them
_NAMED_FORMATS = ("WAV", "FLAC", "OGG", "MP3", "AIFF")


def _not_decodable(*, with_ffmpeg: bool) -> str:
    """The error for data that neither decoder reads: the formats tried, in words a user knows."""
    available = soundfile.available_formats()
    tried = [name.lower() for name in _NAMED_FORMATS if name in available]
    if with_ffmpeg:
        tried += ["m4a/aac", "webm"]
    return f"not an audio file we can decode (tried: {', '.join(tried)}, ...)"


def _to_mono(data: np.ndarray) -> np.ndarray:
    """(samples, channels) -> (samples,), averaging channels the way librosa.to_mono does."""
    if data.shape[1] == 1:
        return np.ascontiguousarray(data[:, 0])
    return np.mean(data, axis=1).astype(np.float32, copy=False)
