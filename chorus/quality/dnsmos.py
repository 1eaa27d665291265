"""DNSMOS P.835 scores (SIG, BAK, OVRL) of sampled requests (docs/quality.md, "DNSMOS"); the
sampler (``chorus.quality.sampler``) runs the model in a worker process. Needs
``chorus-tts[quality]``: Microsoft's DNSMOS ONNX model as the ``speechmos`` wheel ships it (only
its model file is used), run by ``onnxruntime`` on the CPU.

The model reads 9.01 s windows of 16 kHz audio and gives raw SIG, BAK and OVRL, which a cubic
per score maps onto the P.835 scale (1-5), as Microsoft's DNS Challenge scorer does; a shorter
clip is repeated to fill a window. Unlike that scorer's 1 s hop, windows here do not overlap
and at most ``MAX_WINDOWS`` are scored, so the cost per audio second is bounded and constant.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import numpy as np

MODEL_RATE = 16_000
WINDOW_SAMPLES = int(9.01 * MODEL_RATE)
MAX_WINDOWS = 4  # at most 36 s of a request are scored
# the P.835 mapping of the raw outputs (DNSMOS P.835, non-personalised: highest power first)
_SIG = np.poly1d([-0.08397278, 1.22083953, 0.0052439])
_BAK = np.poly1d([-0.13166888, 1.60915514, -0.39604546])
_OVRL = np.poly1d([-0.06766283, 1.11546468, 0.04602535])
SCORES = ("sig", "bak", "ovrl")
# the label buckets of the CFG weight and exaggeration (the upper edge that holds the value)
CFG_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)
EXAGGERATION_EDGES = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def available() -> bool:
    """Whether the ``[quality]`` extra is installed (``onnxruntime`` and ``speechmos``)."""
    return importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("speechmos") is not None


@dataclass(frozen=True)
class Scores:
    sig: float
    bak: float
    ovrl: float


class DNSMOS:
    """The P.835 model on the CPU, one intra-op thread (it must not take the cores the server's
    own threads use)."""

    def __init__(self, threads: int = 1):
        import importlib.resources

        import onnxruntime

        model = importlib.resources.files("speechmos") / "dnsmos_models" / "sig_bak_ovr.onnx"
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def score(self, wav: np.ndarray, sample_rate: int) -> Scores:
        """The mean P.835 scores of ``wav``'s windows (mono float in [-1, 1]; clipped there)."""
        return self.score_clip(model_clip(wav, sample_rate))

    def score_clip(self, clip: np.ndarray) -> Scores:
        """The mean P.835 scores of a clip as :func:`model_clip` makes it (float32 at 16 kHz)."""
        if clip.size == 0:
            raise ValueError("no audio to score")
        if clip.size < WINDOW_SAMPLES:
            clip = np.tile(clip, -(-WINDOW_SAMPLES // clip.size))
        count = min(MAX_WINDOWS, clip.size // WINDOW_SAMPLES)
        windows = clip[:count * WINDOW_SAMPLES].reshape(count, WINDOW_SAMPLES)
        raw = np.stack([self._session.run(None, {self._input: w[None, :]})[0][0] for w in windows])
        sig, bak, ovrl = raw.T
        return Scores(float(np.mean(_SIG(sig))), float(np.mean(_BAK(bak))), float(np.mean(_OVRL(ovrl))))


def scored_span(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """The start of ``wav`` that decides its score: ``MAX_WINDOWS`` windows and 100 ms more (the
    resampler reads ahead; with the margin, resampling this span gives the samples of resampling
    the whole clip, bit for bit)."""
    return wav[:math.ceil(MAX_WINDOWS * WINDOW_SAMPLES * sample_rate / MODEL_RATE) + sample_rate // 10]


def model_clip(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """``wav`` as the model reads it: clipped to [-1, 1], float32 at 16 kHz, at most
    ``MAX_WINDOWS`` windows long."""
    audio = np.clip(np.asarray(scored_span(wav, sample_rate), np.float32), -1.0, 1.0)
    if sample_rate != MODEL_RATE:
        from chorus.audio.resample import resample

        audio = resample(audio, sample_rate, MODEL_RATE).astype(np.float32)
    return audio[:MAX_WINDOWS * WINDOW_SAMPLES]


def bucket(value: float, edges: tuple[float, ...]) -> str:
    """The label of ``value``'s bucket: the first edge at or above it, else ``+Inf``."""
    for edge in edges:
        if value <= edge:
            return f"{edge:g}"
    return "+Inf"


@dataclass(frozen=True)
class Job:
    wav: np.ndarray
    sample_rate: int
    cfg_weight: float
    exaggeration: float
    request_id: str
