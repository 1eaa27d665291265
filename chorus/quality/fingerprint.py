"""The canary's integrity fingerprint (docs/quality.md, "The canary's fingerprint").

The canary speaks a fixed text with the built-in voice and seed 0, so a model that still works
as it did speaks it the same way: the same speech tokens exactly (a request's sampling depends
only on its own seed, whatever else is in the batch) and nearly the same audio (batching may
change the rounding of bf16 arithmetic, so the audio is compared by SNR against a floor, not
bit for bit). The first canary of a loaded model version records its fingerprint; every later
one is compared with it.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SNR_FLOOR_DB = 20.0  # the canary's audio against its fingerprint: below this it is "audio" mismatch
SILENT_DBFS = -60.0  # a canary whose RMS is below this is silent
SNR_CAP_DB = 200.0  # what identical audio reports (its SNR is infinite)


@dataclass(frozen=True)
class Fingerprint:
    """What one canary made: each chunk's speech tokens and the waveform."""

    tokens: tuple[tuple[int, ...], ...]
    wav: np.ndarray

    @classmethod
    def of(cls, tokens: Sequence[Sequence[int]], wav: np.ndarray) -> "Fingerprint":
        return cls(tuple(tuple(int(t) for t in chunk) for chunk in tokens), np.asarray(wav, np.float32).copy())

    @property
    def rms_dbfs(self) -> float:
        if self.wav.size == 0 or not np.isfinite(self.wav).all():
            return -math.inf if self.wav.size == 0 else math.nan
        mean_square = float(np.mean(self.wav.astype(np.float64) ** 2))
        return 10 * math.log10(mean_square) if mean_square > 0 else -math.inf

    def summary(self) -> dict:
        """For the log: short enough for one line, enough to tell two fingerprints apart."""
        flat = [t for chunk in self.tokens for t in chunk]
        digest = hashlib.sha256(np.asarray(flat, np.int64).tobytes()).hexdigest()[:16]
        rms = self.rms_dbfs
        return {"tokens": len(flat), "tokens_sha256": digest, "first_tokens": flat[:8], "samples": int(self.wav.size),
                "rms_dbfs": round(rms, 2) if math.isfinite(rms) else str(rms)}


@dataclass(frozen=True)
class Comparison:
    """A canary against the fingerprint: ``reason`` is None when it matches, else ``nonfinite``,
    ``silent``, ``tokens`` or ``audio``; ``snr_db`` is the audio's SNR (capped at ``SNR_CAP_DB``;
    None when the audio could not be compared)."""

    reason: str | None
    snr_db: float | None
    detail: str = ""


def compare(reference: Fingerprint, current: Fingerprint, floor_db: float = SNR_FLOOR_DB) -> Comparison:
    """Judge ``current`` against ``reference`` (the first canary's)."""
    if not np.isfinite(current.wav).all():
        return Comparison("nonfinite", None, "the canary's audio holds NaN or inf")
    if current.wav.size == 0 or current.rms_dbfs < SILENT_DBFS:
        return Comparison("silent", None, f"the canary's audio is silent (RMS {current.rms_dbfs:.1f} dBFS, below "
                                          f"{SILENT_DBFS:g})")
    if current.tokens != reference.tokens:
        return Comparison("tokens", None, _token_difference(reference.tokens, current.tokens))
    if current.wav.shape != reference.wav.shape:
        return Comparison("audio", None, f"the canary's audio has {current.wav.size} samples, its fingerprint "
                                         f"{reference.wav.size}")
    snr = snr_db(reference.wav, current.wav)
    if snr < floor_db:
        return Comparison("audio", snr,
                          f"the canary's audio is {snr:.1f} dB from its fingerprint (floor {floor_db:g} dB)")
    return Comparison(None, snr)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """``test`` against ``reference`` in dB, capped at ``SNR_CAP_DB`` (identical audio)."""
    import torch

    from chorus.vocoder.quality import snr_db as tensor_snr_db

    if not np.any(reference):
        return SNR_CAP_DB if not np.any(test) else -SNR_CAP_DB
    return min(SNR_CAP_DB, tensor_snr_db(torch.from_numpy(reference), torch.from_numpy(test)))


def _token_difference(reference, current) -> str:
    ref = [t for chunk in reference for t in chunk]
    cur = [t for chunk in current for t in chunk]
    first = next((i for i, (a, b) in enumerate(zip(ref, cur)) if a != b), min(len(ref), len(cur)))
    return (f"the canary's speech tokens differ from its fingerprint's from token {first} "
            f"({len(cur)} against {len(ref)})")
