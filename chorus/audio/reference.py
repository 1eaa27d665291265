"""Reference clips: decode, validate, normalise, and derive the copies the voice front end needs.

Mirrors the reference ``prepare_conditionals``: the clip is loaded at 24 kHz (soxr HQ), Turbo and
Nano bring it to -27 LUFS, and a 16 kHz soxr copy of the whole clip feeds the VoiceEncoder and
T3's prompt tokens; S3Gen's ``embed_ref`` takes the first 10 s of the 24 kHz clip.

Rules Chorus adds (the reference crashes or silently produces garbage instead):

- empty clips and clips shorter than :data:`MIN_REFERENCE_SECONDS` are rejected;
- a clip is *silent* when its peak is below :data:`SILENCE_PEAK_DBFS` (-60 dBFS, i.e. no sample
  above 0.001 in magnitude) and is rejected;
- a variant's ``min_reference_seconds`` is enforced with the reference's strict ">" (Turbo and
  Nano need more than 5 s);
- clips longer than :data:`MAX_SOURCE_SECONDS` (10 minutes) are refused (``AudioTooLongError``)
  from the header's stated length, or while decoding, which stops there: a small file that
  decodes to hours (a decompression bomb) costs at most that much decoding;
- clips longer than ``max_seconds`` (default :data:`MAX_REFERENCE_SECONDS`, 60 s) are cut to
  their first ``max_seconds`` while decoding and flagged ``truncated``. Only the VoiceEncoder
  embedding sees audio past 15 s, so results for such clips differ slightly from the reference,
  which embeds the whole clip.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from chorus.audio.errors import ReferenceAudioError
from chorus.audio.io import AudioSource, DecodedAudio, decode_audio
from chorus.audio.loudness import integrated_loudness, normalize_loudness
from chorus.audio.resample import resample

S3GEN_SAMPLE_RATE = 24000
TOKENIZER_SAMPLE_RATE = 16000
MIN_REFERENCE_SECONDS = 0.5
MAX_REFERENCE_SECONDS = 60.0
MAX_SOURCE_SECONDS = 600.0  # longer sources are refused, not cut (see the module docstring)
SILENCE_PEAK_DBFS = -60.0


@dataclass(frozen=True)
class ReferencePolicy:
    """How one variant treats reference clips (see :meth:`for_variant`)."""

    min_seconds: float = 0.0  # the variant's own minimum, compared with ">"
    max_seconds: float = MAX_REFERENCE_SECONDS
    loudness_lufs: float | None = None
    t3_prompt_seconds: float = 6.0
    s3gen_prompt_seconds: float = 10.0
    variant_name: str = "this"

    @classmethod
    def for_variant(cls, variant, *, max_seconds: float = MAX_REFERENCE_SECONDS) -> "ReferencePolicy":
        """Policy of a :class:`chorus.models.variants.Variant`."""
        return cls(
            min_seconds=variant.min_reference_seconds, max_seconds=max_seconds,
            loudness_lufs=variant.loudness_lufs, t3_prompt_seconds=variant.t3_prompt_seconds,
            s3gen_prompt_seconds=variant.s3gen_prompt_seconds, variant_name=variant.name,
        )


@dataclass(frozen=True)
class ReferenceAudio:
    """A validated reference clip and its derived copies (mono float32)."""

    wav_24k: np.ndarray  # whole clip at 24 kHz, loudness-normalised if the variant asks for it
    wav_16k: np.ndarray  # soxr copy of ``wav_24k``: VoiceEncoder input and T3 prompt source
    policy: ReferencePolicy
    truncated: bool  # the source was longer than ``policy.max_seconds`` and was cut
    measured_lufs: float | None  # loudness before normalisation (None when not normalised)

    @property
    def duration(self) -> float:
        return len(self.wav_24k) / S3GEN_SAMPLE_RATE

    @property
    def s3gen_prompt_24k(self) -> np.ndarray:
        """The part S3Gen's ``embed_ref`` sees (first 10 s)."""
        return self.wav_24k[: int(self.policy.s3gen_prompt_seconds * S3GEN_SAMPLE_RATE)]

    @property
    def t3_prompt_16k(self) -> np.ndarray:
        """The part tokenized for T3's speech prompt (first 6 s, or 15 s for Turbo/Nano)."""
        return self.wav_16k[: int(self.policy.t3_prompt_seconds * TOKENIZER_SAMPLE_RATE)]


def prepare_reference(source: AudioSource | DecodedAudio, policy: ReferencePolicy = ReferencePolicy()) -> ReferenceAudio:
    """Decode (unless already decoded), validate and normalise a reference clip.

    Raises :class:`chorus.audio.AudioDecodeError` for undecodable data and
    :class:`ReferenceAudioError` for empty, silent or too-short clips.
    """
    if isinstance(source, DecodedAudio):
        if source.samples.ndim != 1:
            raise ValueError(f"DecodedAudio.samples must be mono (1-D), got shape {source.samples.shape}")
        decoded = _cut(source, policy.max_seconds)
    else:
        decoded = decode_audio(source, max_seconds=policy.max_seconds, refuse_seconds=MAX_SOURCE_SECONDS)
    wav = resample(decoded.samples, decoded.sample_rate, S3GEN_SAMPLE_RATE)
    check_reference(wav, S3GEN_SAMPLE_RATE, policy)
    measured = None
    if policy.loudness_lufs is not None:
        measured = integrated_loudness(wav, S3GEN_SAMPLE_RATE)
        wav = normalize_loudness(wav, S3GEN_SAMPLE_RATE, policy.loudness_lufs)
    wav_16k = resample(wav, S3GEN_SAMPLE_RATE, TOKENIZER_SAMPLE_RATE)
    return ReferenceAudio(wav_24k=wav, wav_16k=wav_16k, policy=policy, truncated=decoded.truncated,
                          measured_lufs=measured)


def check_reference(wav: np.ndarray, sample_rate: int, policy: ReferencePolicy = ReferencePolicy()) -> None:
    """Raise :class:`ReferenceAudioError` unless ``wav`` is usable as a voice reference."""
    if wav.size == 0:
        raise ReferenceAudioError("the reference clip contains no audio samples", reason="empty")
    duration = wav.shape[0] / sample_rate
    if duration < MIN_REFERENCE_SECONDS:
        raise ReferenceAudioError(
            f"the reference clip is {duration:.2f} s long; at least {MIN_REFERENCE_SECONDS} s of speech is "
            "needed (5-15 s of clean speech works best)", reason="too_short"
        )
    if policy.min_seconds > 0 and not duration > policy.min_seconds:
        raise ReferenceAudioError(
            f"the reference clip is {duration:.2f} s long; the {policy.variant_name} variant needs more than "
            f"{policy.min_seconds:g} s of audio", reason="too_short"
        )
    peak = float(np.max(np.abs(wav)))
    peak_dbfs = 20.0 * math.log10(peak) if peak > 0 else -math.inf
    if peak_dbfs < SILENCE_PEAK_DBFS:
        raise ReferenceAudioError(
            f"the reference clip is silent (peak {peak_dbfs:.1f} dBFS, below {SILENCE_PEAK_DBFS:g} dBFS)",
            reason="silent",
        )


def _cut(decoded: DecodedAudio, max_seconds: float) -> DecodedAudio:
    limit = int(max_seconds * decoded.sample_rate)
    if len(decoded.samples) <= limit:
        return decoded
    return DecodedAudio(samples=decoded.samples[:limit], sample_rate=decoded.sample_rate, truncated=True)
