"""Optional audio watermark: Resemble AI's Perth implicit watermark, as the reference applies it.

The reference watermarks every output as its very last step with ``resemble-perth``'s
``PerthImplicitWatermarker`` (CPU, deterministic). Chorus makes it opt-in (``watermark="perth"``,
``chorus synth --watermark perth``) and imports the package only when asked.

The package is the ``watermark`` extra. Its import needs torch, torchaudio, librosa, scipy, pyyaml
and ``pkg_resources`` (setuptools < 82); when one is missing, ``perth`` still imports but silently
sets ``PerthImplicitWatermarker`` to None. :func:`get_watermarker` detects that and raises
:class:`WatermarkUnavailableError` naming the missing piece.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import io
import warnings
from typing import Iterator, Protocol

import numpy as np

WATERMARKERS = ("perth",)
INSTALL_HINT = ("install the watermark extra: pip install 'chorus-tts[watermark]' "
                "(resemble-perth==1.0.1 with 'setuptools<82', librosa, torchaudio, scipy, pyyaml)")


class WatermarkUnavailableError(ImportError):
    """The requested watermarker cannot be loaded in this environment."""


class Watermarker(Protocol):
    name: str

    def apply(self, wav: np.ndarray, sample_rate: int) -> np.ndarray: ...


class PerthWatermarker:
    """``perth.PerthImplicitWatermarker`` behind a small interface (float32 mono in and out)."""

    name = "perth"

    def __init__(self, device: str = "cpu"):
        cls = _perth_class()
        with _quiet():
            self._impl = cls(device=device)

    def apply(self, wav: np.ndarray, sample_rate: int) -> np.ndarray:
        """Watermarked copy of mono float samples at ``sample_rate``, same length."""
        wav = np.asarray(wav, dtype=np.float32)
        if wav.size == 0:
            return wav
        marked = np.asarray(self._impl.apply_watermark(wav, sample_rate=sample_rate), dtype=np.float32)
        if marked.shape != wav.shape:  # resampling 24k -> 32k -> 24k can be a sample off
            marked = np.pad(marked, (0, max(0, wav.shape[0] - marked.shape[0])))[: wav.shape[0]]
        return marked

    def detect(self, wav: np.ndarray, sample_rate: int) -> float:
        """Mean of the decoded watermark bits in [0, 1] (near 1 for watermarked audio)."""
        bits = self._impl.get_watermark(np.asarray(wav, dtype=np.float32), sample_rate=sample_rate, round=False)
        return float(np.mean(bits))


def _perth_class():
    """``perth.PerthImplicitWatermarker``, or a :class:`WatermarkUnavailableError` saying why not."""
    try:
        with _quiet():
            perth = importlib.import_module("perth")
    except ImportError as exc:
        raise WatermarkUnavailableError(f"the perth watermark needs the resemble-perth package ({exc}); "
                                        f"{INSTALL_HINT}") from exc
    base = getattr(perth, "WatermarkerBase", None)
    cls = getattr(perth, "PerthImplicitWatermarker", None)
    if base is None:
        raise WatermarkUnavailableError(
            f"the installed 'perth' module ({getattr(perth, '__file__', '?')}) is not resemble-perth; {INSTALL_HINT}")
    if cls is None:
        raise WatermarkUnavailableError(f"resemble-perth is installed but its watermarker failed to import "
                                        f"({_perth_import_failure()}); {INSTALL_HINT}")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise WatermarkUnavailableError(f"perth.PerthImplicitWatermarker is not a Perth watermarker; {INSTALL_HINT}")
    return cls


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence resemble-perth's import-time noise: the pkg_resources deprecation warning and the
    "loaded PerthNet ..." line it prints to stdout (which would mix with our own output)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _perth_import_failure() -> str:
    """The error perth swallowed when it set ``PerthImplicitWatermarker`` to None."""
    try:
        with _quiet():
            importlib.import_module("perth.perth_net.perth_net_implicit.perth_watermarker")
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the answer
        return f"{type(exc).__name__}: {exc}"
    return "unknown reason"


@functools.lru_cache(maxsize=4)
def _cached(name: str, device: str) -> Watermarker:
    if name == "perth":
        return PerthWatermarker(device=device)
    raise AssertionError(name)


def get_watermarker(name: str | None, device: str = "cpu") -> Watermarker | None:
    """The watermarker called ``name`` (loaded once per process), or None for None/"none"/"off"."""
    if name is None or name.lower() in ("none", "off", ""):
        return None
    key = name.lower()
    if key not in WATERMARKERS:
        raise ValueError(f"unknown watermark {name!r}; choose one of: {', '.join(WATERMARKERS)} (or none)")
    return _cached(key, device)


def apply_watermark(wav: np.ndarray, sample_rate: int, name: str | None) -> np.ndarray:
    """``wav`` watermarked with ``name`` (unchanged when ``name`` is None)."""
    marker = get_watermarker(name)
    return wav if marker is None else marker.apply(wav, sample_rate)
