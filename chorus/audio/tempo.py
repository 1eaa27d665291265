"""Speed change with the pitch kept: FFmpeg's ``atempo`` filter through PyAV, fed piece by piece.

One ``atempo`` instance accepts 0.5-2.0 (newer FFmpeg goes up to 100, but above 2 it skips samples
rather than blending them), so a speed outside that range is split into equal factors inside it,
chained: 0.25 is 0.5 x 0.5, 4.0 is 2.0 x 2.0, 3.0 is 1.732 x 1.732. See docs/audio-formats.md for
the measured durations.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

MIN_SPEED = 0.25
MAX_SPEED = 4.0
_ATEMPO_MIN, _ATEMPO_MAX = 0.5, 2.0


def check_speed(speed: float) -> float:
    """``speed`` as a float, or a ``ValueError`` unless it is a number in [MIN_SPEED, MAX_SPEED]."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float, np.integer, np.floating)):
        raise ValueError(f"speed must be a number between {MIN_SPEED} and {MAX_SPEED}, got {speed!r}")
    value = float(speed)
    if not (MIN_SPEED <= value <= MAX_SPEED):  # also refuses NaN
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed!r}")
    return value


def atempo_factors(speed: float) -> list[float]:
    """The fewest equal ``atempo`` factors, each within 0.5-2.0, whose product is ``speed``."""
    speed = check_speed(speed)
    count = max(1, math.ceil(abs(math.log2(speed)) - 1e-9))
    factor = speed ** (1.0 / count)
    return [min(max(factor, _ATEMPO_MIN), _ATEMPO_MAX)] * count


class TempoStream:
    """Streams mono float32 samples through ``abuffer -> atempo(s) -> abuffersink``.

    ``process`` returns whatever the filter has ready (atempo holds back about one analysis window,
    tens of milliseconds, so the first call often returns nothing); ``flush`` ends the stream and
    returns the rest. The output lasts about ``input / speed``.
    """

    def __init__(self, speed: float, sample_rate: int):
        import av

        self.speed = check_speed(speed)
        if not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate <= 0:
            raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
        self.sample_rate = sample_rate
        self._av = av
        self._time_base = Fraction(1, sample_rate)
        self._graph = av.filter.Graph()
        nodes = [self._graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono",
                                         time_base=self._time_base)]
        nodes += [self._graph.add("atempo", repr(factor)) for factor in atempo_factors(self.speed)]
        nodes.append(self._graph.add("abuffersink"))
        self._graph.link_nodes(*nodes).configure()
        self._pts = 0
        self._done = False

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Push mono float32 samples (1-D, already checked) and return the output ready so far."""
        if self._done:
            raise ValueError("the tempo stream is already flushed")
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if samples.size:
            frame = self._av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.time_base = self._time_base
            frame.pts = self._pts
            self._pts += samples.size
            self._graph.push(frame)
        return self._pull()

    def flush(self) -> np.ndarray:
        """End the input and return the remaining output (later calls return nothing)."""
        if self._done:
            return np.zeros(0, np.float32)
        self._done = True
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> np.ndarray:
        pieces = []
        while True:
            try:
                frame = self._graph.pull()
            except (self._av.BlockingIOError, self._av.EOFError):
                break
            pieces.append(frame.to_ndarray().reshape(-1))
        if not pieces:
            return np.zeros(0, np.float32)
        return np.concatenate(pieces).astype(np.float32, copy=False)


def change_tempo(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """A whole clip at ``speed`` (pitch kept); 1.0 returns the samples as they are."""
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {samples.shape}")
    if check_speed(speed) == 1.0:
        return samples
    stream = TempoStream(speed, sample_rate)
    head = stream.process(samples)
    return np.concatenate([head, stream.flush()])
