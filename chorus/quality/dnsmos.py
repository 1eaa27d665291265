"""DNSMOS P.835 scores (SIG, BAK, OVRL) of sampled requests, in a bounded worker thread
(docs/quality.md, "DNSMOS"). Needs ``chorus-tts[quality]``: Microsoft's DNSMOS ONNX model as the
``speechmos`` wheel ships it (only its model file is used), run by ``onnxruntime`` on the CPU.

The model reads 9.01 s windows of 16 kHz audio and gives raw SIG, BAK and OVRL, which a cubic
per score maps onto the P.835 scale (1-5), as Microsoft's DNS Challenge scorer does; a shorter
clip is repeated to fill a window. Unlike that scorer's 1 s hop, windows here do not overlap
and at most ``MAX_WINDOWS`` are scored, so the cost per audio second is bounded and constant.
"""
from __future__ import annotations

import importlib.util
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

logger = logging.getLogger("chorus.server")

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
        from chorus.audio.resample import resample

        audio = np.clip(np.asarray(wav, np.float32), -1.0, 1.0)
        if sample_rate != MODEL_RATE:
            audio = resample(audio, sample_rate, MODEL_RATE).astype(np.float32)
        if audio.size == 0:
            raise ValueError("no audio to score")
        if audio.size < WINDOW_SAMPLES:
            audio = np.tile(audio, -(-WINDOW_SAMPLES // audio.size))
        count = min(MAX_WINDOWS, audio.size // WINDOW_SAMPLES)
        windows = audio[:count * WINDOW_SAMPLES].reshape(count, WINDOW_SAMPLES)
        raw = np.stack([self._session.run(None, {self._input: w[None, :]})[0][0] for w in windows])
        sig, bak, ovrl = raw.T
        return Scores(float(np.mean(_SIG(sig))), float(np.mean(_BAK(bak))), float(np.mean(_OVRL(ovrl))))


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


class QualitySampler:
    """Scores a sampled share of requests in one daemon thread behind a bounded queue: a
    request is offered its audio when it has ended (``offer`` never blocks: a full queue skips
    it, counted), and the thread reports each score to ``observe(job, scores, seconds)``."""

    def __init__(self, rate: float, observe: Callable[[Job, Scores, float], None], skipped: Callable[[], None], *,
                 capacity: int = 8, rng: random.Random | None = None, scorer: DNSMOS | None = None):
        self.rate = rate
        self._observe, self._skipped = observe, skipped
        self._rng = rng or random.Random()
        self._scorer = scorer or DNSMOS()
        self._queue: queue.Queue = queue.Queue(capacity)
        self._thread = threading.Thread(target=self._run, name="chorus-dnsmos", daemon=True)
        self._thread.start()

    def sampled(self) -> bool:
        """Whether the next request is scored (drawn per request)."""
        return self._rng.random() < self.rate

    def offer(self, job: Job) -> None:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._skipped()

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the job being scored (jobs still queued are dropped)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                started = time.perf_counter()
                scores = self._scorer.score(job.wav, job.sample_rate)
                self._observe(job, scores, time.perf_counter() - started)
            except Exception:  # noqa: BLE001 - the worker must not die
                logger.exception("DNSMOS scoring failed", extra={"request_id": job.request_id})
