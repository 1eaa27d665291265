"""The source clip of a voice conversion: decoded, checked against the limits, at 16 kHz.

The reference loads the source with ``librosa.load(path, sr=16000)``: soundfile's samples, mono,
resampled by soxr HQ straight from the file's rate to 16 kHz. Chorus does the same
(:func:`chorus.audio.decode_audio` and :func:`chorus.audio.resample`), so the S3 tokenizer sees
the reference's samples. Unlike the reference, a source must be decodable, not empty, not silent,
at least ``min_source_s`` and at most ``max_source_s`` long (:class:`ConversionConfig`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

from chorus.audio import AudioDecodeError, AudioError, AudioTooLongError, DecodedAudio, decode_audio, resample
from chorus.audio.io import AudioSource
from chorus.audio.reference import SILENCE_PEAK_DBFS
from chorus.conversion.config import ConversionConfig

TOKENIZER_SAMPLE_RATE = 16000

SourceInput = Union[AudioSource, DecodedAudio, np.ndarray]


class SourceAudioError(AudioError):
    """A source clip that cannot be converted. ``reason``: ``too_long`` (over ``max_source_s``;
    ``status`` 413), ``invalid_audio`` (not decodable), ``empty``, ``too_short`` or ``silent``
    (``status`` 400). A ``ValueError``, like every :class:`chorus.audio.AudioError`."""

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason

    @property
    def status(self) -> int:
        """The HTTP status a server answers with: 413 for a source over the limit, else 400."""
        return 413 if self.reason == "too_long" else 400


@dataclass(frozen=True)
class SourceAudio:
    """A checked source clip: mono float32 at 16 kHz (what the S3 tokenizer reads)."""

    wav_16k: np.ndarray

    @property
    def duration(self) -> float:
        return len(self.wav_16k) / TOKENIZER_SAMPLE_RATE


def prepare_source(source: SourceInput, config: ConversionConfig = ConversionConfig(), *,
                   sample_rate: int | None = None) -> SourceAudio:
    """Decode (unless given decoded samples) and check a source clip; see the module docstring.

    ``source`` is a path, bytes, a binary file, :class:`DecodedAudio`, or a mono float array with
    its ``sample_rate``. Raises :class:`SourceAudioError` (or ``FileNotFoundError`` for a missing
    path). Nothing past ``max_source_s`` is decoded.
    """
    limit = config.max_source_s
    if isinstance(source, np.ndarray):
        source = DecodedAudio.from_array(source, sample_rate, "a source")
    elif sample_rate is not None and not isinstance(source, DecodedAudio):
        raise ValueError("sample_rate is only for sources given as arrays")
    if isinstance(source, DecodedAudio):
        if source.samples.ndim != 1:
            raise ValueError(f"DecodedAudio.samples must be mono (1-D), got shape {source.samples.shape}")
        if source.samples.size and not np.isfinite(source.samples).all():
            raise SourceAudioError("the source audio contains NaN or infinite sample values", reason="invalid_audio")
        decoded = source
    else:
        try:
            decoded = decode_audio(source, refuse_seconds=limit)
        except AudioTooLongError as exc:
            raise SourceAudioError(f"the source clip is too long for voice conversion ({_after_colon(exc)}); "
                                   "split it", reason="too_long") from exc
        except AudioDecodeError as exc:
            raise SourceAudioError(str(exc), reason="invalid_audio") from exc
    _check(decoded, config)
    return SourceAudio(resample(decoded.samples, decoded.sample_rate, TOKENIZER_SAMPLE_RATE))


def _after_colon(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if ": " in text else text


def _check(decoded: DecodedAudio, config: ConversionConfig) -> None:
    wav = decoded.samples
    if wav.size == 0:
        raise SourceAudioError("the source clip contains no audio samples", reason="empty")
    duration = decoded.duration
    if duration > config.max_source_s:
        raise SourceAudioError(f"the source clip is {duration:.1f} s long; voice conversion takes at most "
                               f"{config.max_source_s:g} s (split it)", reason="too_long")
    if duration < config.min_source_s:
        raise SourceAudioError(f"the source clip is {duration:.3f} s long; voice conversion needs at least "
                               f"{config.min_source_s:g} s of speech", reason="too_short")
    peak = float(np.max(np.abs(wav)))
    peak_dbfs = 20.0 * math.log10(peak) if peak > 0 else -math.inf
    if peak_dbfs < SILENCE_PEAK_DBFS:
        raise SourceAudioError(f"the source clip is silent (peak {peak_dbfs:.1f} dBFS, below "
                               f"{SILENCE_PEAK_DBFS:g} dBFS): there is no speech to convert", reason="silent")
