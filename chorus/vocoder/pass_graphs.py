"""CUDA graphs of a whole vocoder pass: the flow (encoder and solver) and HiFT, one graph each.

Eagerly, one pass launches thousands of small kernels from Python (a conformer encoder, ``n_steps``
estimator calls of a few hundred kernels each, HiFT's convolutions). A GPU then waits for Python
to launch them, and every launch gives the GIL back: beside the T3 thread, which is also Python,
each launch may wait for it. :class:`PassGraphs` runs a pass as two graph replays instead:

* **flow**: ``FlowDecoder.generate_mel`` (embedding, conformer encoder, projection, the whole Euler
  loop with its CFG rows and combine) over the prompt and new tokens of every item;
* **HiFT**: F0 prediction, the harmonic source and the decoder (convolutions, source STFT,
  inverse STFT) over the frames the pass vocodes.

Buckets and keys: a call is padded up to a row bucket (:func:`row_bucket`, powers of two) and a
frame bucket (:func:`frame_bucket`: multiples of 64 frames up to 1024, then 8 sizes per doubling,
so padding stays under 1/8). Padded frames carry zero inputs and are masked; padded rows get one
token (or frame) and are cut off. Every operator keeps an item's valid frames independent of
padding (masked attention keys, causal or masked convolutions, per-frame norms, per-item inverse
STFT envelope), so valid outputs are those of the unpadded call up to the rounding of kernels
chosen for other shapes. One graph per :class:`FlowKey` (rows, frames, steps, guided, meanflow,
dtype; the CFG weight is a device scalar filled before each replay) and per :class:`HiFTKey`
(rows, frames, dtype).

Memory: every graph shares one memory pool for its intermediates (replays run one at a time on
one stream, and each replay's output is copied out before the next; after a failed capture the
graphs captured from then on share a new one, ``capture_gate.CaptureTarget``); each graph owns its static
inputs and outputs. At most ``max_graphs`` graphs of each kind are kept, least recently used
dropped first. Capture runs on a side stream in ``thread_local`` mode (another thread's CUDA
calls stay legal meanwhile), after an eager run on that stream; inputs are copied in and the graph
replayed on the caller's current stream.

A shape with no graph of its own (not captured at warm-up) replays the held graph of at least
its rows and frames whose padded work (rows x frames) is least, when that is at most
``cover_work`` times its own bucket's: more padding, the same valid values (a voice prompt
shorter than warm-up's, a final pass's short tail). A capture holds up every stream of the
stage for its duration (about 0.5 s on an H200), so a covered shape is not captured mid-pass on
its ``capture_after``-th use: from then on it is *due*, and :meth:`GraphLibrary.capture_due`
captures it when the stage has nothing to do; only a shape used ``covered_capture_after`` times
(None: never) is captured in a pass, so a server that is never idle still gets graphs for its
frequent shapes. A shape no held graph covers is captured on its ``capture_after``-th use, as
before. When graphs are off, on the CPU, for more rows than ``max_rows``, or when no held graph
covers a shape not yet captured, a call runs the same function eagerly on the unpadded inputs.

HiFT's decoder (``HiFTGenerator.decode``) may run through ``torch.compile`` in both ways
(:class:`HiFTRunner`): a graph then captures the compiled kernels, compiled during the eager run
that precedes every capture (or earlier, by :meth:`HiFTRunner.compile`), never inside one.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Generic, Hashable, TypeVar

import torch

from chorus import capture_gate
from chorus.models.s3gen.flow import FlowDecoder
from chorus.models.s3gen.hift import HiFTGenerator, SourceNoise
from chorus.vocoder.config import VocoderStats

logger = logging.getLogger(__name__)

FRAME_STEP = 64
"""Frame buckets are multiples of this many frames (more above 1024 frames; see frame_bucket)."""
BUCKETS_PER_DOUBLING = 8


def row_bucket(rows: int) -> int:
    """Rows a graph is captured for: the next power of two (1, 2, 4, 8, 16, 32, ...)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    return 1 << (rows - 1).bit_length()


def frame_bucket(frames: int) -> int:
    """Frames a graph is captured for: ``frames`` rounded up to a multiple of 64 up to 1024,
    above that to one of 8 evenly spaced sizes per doubling (1152, 1280, ... 2048, 2304, ...).
    The padding is under max(64, frames / 8) frames."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    octave_top = 1 << (frames - 1).bit_length()  # the power of two >= frames
    step = max(FRAME_STEP, octave_top // (2 * BUCKETS_PER_DOUBLING))
    return -(-frames // step) * step


# ------------------------------------------------------------------------------------------ flow
@dataclass(frozen=True)
class FlowKey:
    """What a captured flow graph is specific to (``frames`` = token-mel ratio x padded tokens)."""

    rows: int
    frames: int
    n_steps: int
    guided: bool
    meanflow: bool
    dtype: torch.dtype


class FlowInputs:
    """Static buffers of one flow graph: ``generate_mel``'s inputs padded to the key's shape."""

    def __init__(self, key: FlowKey, ratio: int, device: torch.device):
        rows, frames, like = key.rows, key.frames, dict(device=device, dtype=key.dtype)
        assert frames % ratio == 0, (frames, ratio)
        self.key = key
        self.tokens = torch.zeros(rows, frames // ratio, dtype=torch.long, device=device)
        self.lengths = torch.ones(rows, dtype=torch.long, device=device)
        self.cond = torch.zeros(rows, 80, frames, **like)
        self.noise = torch.zeros(rows, 80, frames, **like)
        self.speaker = torch.zeros(rows, 80, **like)
        weights = dict(device=device, dtype=torch.float32)
        self.weights = (torch.zeros((), **weights), torch.zeros((), **weights)) if key.guided else None

    def load(self, call: "FlowCall") -> None:
        """Copy a call in (on the current stream); padded rows get one token, padding zeros."""
        batch, width = call.tokens.shape
        frames = call.cond.shape[2]
        _fill(self.tokens, call.tokens, batch, width, 0)
        self.lengths.fill_(1)
        self.lengths[:batch].copy_(call.lengths)
        _fill(self.cond, call.cond, batch, frames, 0.0)
        _fill(self.noise, call.noise, batch, frames, 0.0)
        self.speaker.zero_()
        self.speaker[:batch].copy_(call.speaker)
        if self.weights is not None:  # v = (1 + w) v(cond) - w v(uncond)
            self.weights[0].fill_(1.0 + call.cfg_rate)
            self.weights[1].fill_(call.cfg_rate)

    def run(self, flow: FlowDecoder) -> torch.Tensor:
        return flow.generate_mel(self.tokens, self.lengths, self.cond, self.noise, self.speaker,
                                 self.key.n_steps, self.weights)


@dataclass
class FlowCall:
    """One pass's flow inputs (see ``FlowDecoder.generate_mel``), unpadded."""

    tokens: torch.Tensor  # [B, L] long: prompt then new tokens, right-padded
    lengths: torch.Tensor  # [B] long
    cond: torch.Tensor  # [B, 80, ratio L]
    noise: torch.Tensor  # [B, 80, ratio L]
    speaker: torch.Tensor  # [B, 80]
    n_steps: int
    cfg_rate: float


# ------------------------------------------------------------------------------------------ HiFT
@dataclass(frozen=True)
class HiFTKey:
    rows: int
    frames: int
    dtype: torch.dtype


class HiFTInputs:
    """Static buffers of one HiFT graph: mel ``[rows, 80, frames]``, frame counts, the source's
    initial phases ``[rows, H]`` and noise ``[rows, H, 480 frames]``."""

    def __init__(self, key: HiFTKey, harmonics: int, samples_per_frame: int, device: torch.device):
        rows, frames = key.rows, key.frames
        self.key = key
        self.mel = torch.zeros(rows, 80, frames, device=device, dtype=key.dtype)
        self.counts = torch.ones(rows, dtype=torch.long, device=device)
        self.phases = torch.zeros(rows, harmonics, device=device)
        self.noise = torch.zeros(rows, harmonics, frames * samples_per_frame, device=device)

    def load(self, call: "HiFTCall") -> None:
        batch, _, frames = call.mel.shape
        _fill(self.mel, call.mel, batch, frames, 0.0)
        self.counts.fill_(1)
        self.counts[:batch].copy_(call.counts)
        self.phases.zero_()
        self.phases[:batch].copy_(call.source.phases)
        _fill(self.noise, call.source.noise, batch, call.source.noise.shape[2], 0.0)

    def run(self, runner: "HiFTRunner") -> tuple[torch.Tensor, torch.Tensor]:
        return runner(self.mel, self.counts, SourceNoise(self.phases, self.noise))


@dataclass
class HiFTCall:
    """One pass's HiFT inputs: mel ``[B, 80, F]`` of the frames to vocode, counts ``[B]``, and the
    harmonic source's draws (noise ``[B, H, >= 480 F]``)."""

    mel: torch.Tensor
    counts: torch.Tensor
    source: SourceNoise


def vocode(hift: HiFTGenerator, mel: torch.Tensor, counts: torch.Tensor | None, source: SourceNoise,
           decode: Callable[..., torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """HiFT over a padded batch with per-item frame counts: (waveform ``[B, 480 F]`` float32, F0
    ``[B, F]`` float32). Every step masked (``counts`` None: every item is all F frames, nothing
    masked), no host synchronisation either way (graph-capturable). ``decode``: what runs
    ``hift.decode`` (e.g. a compiled version of it; None: ``hift.decode`` itself)."""
    f0 = hift.predict_f0(mel, counts)
    excitation = hift.harmonic_source(f0, counts, source)
    return (decode or hift.decode)(mel, excitation, counts).float(), f0.float()


class HiFTRunner:
    """HiFT over a padded batch (:func:`vocode`) with its decoder eager or compiled.

    Compiled: ``torch.compile(hift.decode, dynamic=True)`` (inductor), one compiled function for
    every batch size and frame count. What still makes dynamo compile again, and so bounds the
    compiles of a process: the 0/1 specialisation of sizes (batch 1 is its own compile; frame
    count 1 too, so 1-frame calls stay eager here), the model's dtype, device and HiFT config
    (guarded; two model versions of one architecture share compiles), and size thresholds of the
    convolution backend's choice (seen on the CPU: frame counts past 42 compile again). Past
    dynamo's ``recompile_limit`` (8 per function) a new specialisation runs eagerly, correct but
    slower. :meth:`compile` covers batch 1 and batch >= 2 before serving."""

    def __init__(self, hift: HiFTGenerator, compiled: bool = False):
        self.hift, self.compiled = hift, compiled
        self._decode = torch.compile(hift.decode, dynamic=True) if compiled else hift.decode

    def __call__(self, mel: torch.Tensor, counts: torch.Tensor | None,
                 source: SourceNoise) -> tuple[torch.Tensor, torch.Tensor]:
        decode = self._decode if mel.shape[-1] > 1 else self.hift.decode
        return vocode(self.hift, mel, counts, source, decode)

    @torch.inference_mode()
    def compile(self) -> float:
        """Compile the decoder now (when compiled at all) for the specialisations passes meet:
        one call of 1 row and one of 2 rows, over ``FRAME_STEP`` frames, as graphed calls make
        them (inference tensors, padded buffers). Returns the seconds it took (0.0 when eager)."""
        if not self.compiled:
            return 0.0
        hift, started = self.hift, time.perf_counter()
        device, dtype = hift.conv_pre.weight.device, hift.conv_pre.weight.dtype
        for rows in (1, 2):
            inputs = HiFTInputs(HiFTKey(rows, FRAME_STEP, dtype), hift.config.num_harmonics,
                                hift.config.samples_per_frame, device)
            inputs.run(self)
        return time.perf_counter() - started


def _fill(static: torch.Tensor, value: torch.Tensor, batch: int, length: int, pad) -> None:
    """Copy ``value`` into ``static[:batch, ..., :length]`` and set everything else to ``pad``."""
    if batch < static.shape[0] or length < static.shape[-1]:
        static.fill_(pad)
    static[:batch, ..., :length].copy_(value[..., :length])


# ------------------------------------------------------------------------------------- the library
K = TypeVar("K", bound=Hashable)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: object
    output: object


class GraphLibrary(Generic[K]):
    """Captured graphs of one function by key: LRU of at most ``max_graphs``, captured on a key's
    ``capture_after``-th use (or at once through :meth:`prepare`), keys whose capture failed
    never captured again; a key without a graph may replay a covering one (``cover_work``,
    :meth:`choose`), and is then captured when the stage is idle (:meth:`capture_due`) or on its
    ``covered_capture_after``-th use. ``make_inputs(key)`` builds a key's static buffers (an
    object with ``load(call)`` and ``run(model)``; ``model``: the flow, or a :class:`HiFTRunner`)."""

    def __init__(self, name: str, model: object, make_inputs: Callable[[K], object], *,
                 max_graphs: int, capture_after: int, stats: VocoderStats,
                 target: capture_gate.CaptureTarget | None,
                 cover_work: float | None = None, covered_capture_after: int | None = None):
        self.name, self.model, self.make_inputs = name, model, make_inputs
        self.max_graphs, self.capture_after, self.stats = max_graphs, capture_after, stats
        self.cover_work, self.covered_capture_after = cover_work, covered_capture_after
        self._target = target  # None: never captures (graphs off, or no CUDA)
        self._graphs: OrderedDict[K, _Graph] = OrderedDict()
        self._calls: dict[K, int] = {}  # uses of each key without a graph, since its last capture try
        self._due: set[K] = set()  # covered keys used capture_after times: captured when idle
        self._failed: set[K] = set()

    @property
    def keys(self) -> list[K]:
        """The captured graphs' keys, least recently used first."""
        return list(self._graphs)

    @property
    def failures(self) -> int:
        """Keys whose capture failed (they run eagerly, or replay a covering graph)."""
        return len(self._failed)

    def choose(self, key: K) -> K | None:
        """Count a use of ``key`` and say which graph it replays: ``key`` itself when held or when
        this use should capture it, else the held graph that covers it at the least padded work
        (``cover_work``, see the module docstring), else None (run eagerly). A covered key's
        ``capture_after``-th use makes it due (:meth:`capture_due`) instead of capturing it."""
        if key in self._graphs:
            return key
        cover = self._cover(key)
        if key not in self._failed:
            calls = self._calls.get(key, 0) + 1
            last = self.capture_after if cover is None else self.covered_capture_after
            if last is not None and calls >= last:
                self._calls.pop(key, None)
                self._due.discard(key)
                return key
            self._calls[key] = calls
            if cover is not None and calls >= self.capture_after:
                self._due.add(key)
        return cover

    def capture_due(self) -> bool:
        """Capture the most used of the due keys (covered keys used ``capture_after`` times);
        True when one was captured. For a moment when no call waits on the graphs."""
        while self._due:
            key = max(self._due, key=lambda k: self._calls.get(k, 0))
            self._due.discard(key)
            self._calls.pop(key, None)
            if key not in self._graphs and key not in self._failed:
                return self._lookup(key) is not None
        return False

    def _cover(self, key: K) -> K | None:
        """The held graph of at least ``key``'s rows and frames, otherwise the same, whose padded
        work (rows x frames) is least and at most ``cover_work`` times ``key``'s; None if none.
        Keys with rows and frames only (:class:`FlowKey`, :class:`HiFTKey`)."""
        if self.cover_work is None:
            return None
        best, least = None, self.cover_work * key.rows * key.frames
        for held in self._graphs:
            work = held.rows * held.frames
            if (work <= least and held.rows >= key.rows and held.frames >= key.frames
                    and replace(held, rows=key.rows, frames=key.frames) == key):
                best, least = held, work
        return best

    def replay(self, key: K, call) -> object | None:
        """Load ``call`` into the graph of ``key`` (captured now if missing) and replay it; returns
        the graph's output buffers (valid until the next replay), or None when the capture failed."""
        entry = self._lookup(key)
        if entry is None:
            return None
        entry.inputs.load(call)
        entry.graph.replay()
        self.stats.graph_replays += 1
        return entry.output

    def prepare(self, key: K) -> bool:
        """Capture ``key``'s graph now unless held or failed; True when captured by this call."""
        if key in self._graphs or key in self._failed:
            return False
        return self._lookup(key) is not None

    def clear(self) -> None:
        if self._graphs:
            capture_gate.synchronize()
        self._graphs.clear()
        self._calls.clear()
        self._due.clear()

    def _lookup(self, key: K) -> _Graph | None:
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry
        while len(self._graphs) >= self.max_graphs:
            evicted, _ = self._graphs.popitem(last=False)
            logger.debug("dropping the %s CUDA graph for %s", self.name, evicted)
            # its buffers may have been made on another stream: no replay may still read them
            capture_gate.synchronize()
        started = time.perf_counter()
        try:
            entry = self._capture(key)
        except Exception:  # e.g. out of memory: this shape runs eagerly from now on
            logger.warning("capturing the %s CUDA graph for %s failed; running it eagerly", self.name, key,
                           exc_info=True)
            self._failed.add(key)
            return None
        self.stats.graph_captures += 1
        self.stats.graph_capture_seconds += time.perf_counter() - started
        self._graphs[key] = entry
        return entry

    @torch.inference_mode()
    def _capture(self, key: K) -> _Graph:
        current = torch.cuda.current_stream()
        inputs = self.make_inputs(key)  # zeroed on the current stream
        side = self._target.stream
        side.wait_stream(current)
        with torch.cuda.stream(side):
            inputs.run(self.model)  # lazy initialisation (cuBLAS, cuFFT plans, kernels) outside capture
        graph = torch.cuda.CUDAGraph()
        with self._target.capture(graph):
            output = inputs.run(self.model)
        current.wait_stream(side)
        return _Graph(graph, inputs, output)


class PassGraphs:
    """A vocoder pass's two model calls, replayed from CUDA graphs where enabled (see the module
    docstring), else run eagerly. Not thread-safe: used from the vocoder stage's thread."""

    def __init__(self, flow: FlowDecoder, hift: HiFTGenerator, *, enabled: bool = True, max_graphs: int = 64,
                 max_rows: int | None = None, capture_after: int = 1, cover_work: float | None = None,
                 covered_capture_after: int | None = None, stats: VocoderStats | None = None,
                 compile_hift: bool = False):
        """``max_rows``: calls of more items run eagerly (None: no limit). ``capture_after``: a
        shape is captured on its ``capture_after``-th call (earlier calls replay a covering graph
        of at most ``cover_work`` times their padded work, or run eagerly; None: never covered);
        a covered shape is captured by :meth:`capture_due`, or on its ``covered_capture_after``-th
        call (None: only by :meth:`capture_due`). ``compile_hift``: HiFT's decoder runs compiled,
        graphed or not (:class:`HiFTRunner`)."""
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        if capture_after < 1:
            raise ValueError(f"capture_after must be >= 1, got {capture_after}")
        if cover_work is not None and not cover_work >= 1:
            raise ValueError(f"cover_work must be >= 1 or None, got {cover_work!r}")
        if covered_capture_after is not None and covered_capture_after < 1:
            raise ValueError(f"covered_capture_after must be >= 1 or None, got {covered_capture_after}")
        self.flow, self.hift = flow, hift
        self.hift_runner = HiFTRunner(hift, compile_hift)
        self.enabled, self.max_rows = enabled, max_rows
        self.stats = stats if stats is not None else VocoderStats()
        device = flow.encoder_proj.weight.device
        self.device = device
        target = capture_gate.CaptureTarget(device) if self.active else None
        ratio = flow.config.token_mel_ratio
        hift_config = hift.config
        common = dict(max_graphs=max_graphs, capture_after=capture_after, stats=self.stats, target=target,
                      cover_work=cover_work, covered_capture_after=covered_capture_after)
        self.flow_graphs: GraphLibrary[FlowKey] = GraphLibrary(
            "flow", flow, lambda key: FlowInputs(key, ratio, device), **common)
        self.hift_graphs: GraphLibrary[HiFTKey] = GraphLibrary(
            "HiFT", self.hift_runner,
            lambda key: HiFTInputs(key, hift_config.num_harmonics, hift_config.samples_per_frame, device), **common)

    @property
    def active(self) -> bool:
        """Whether calls may replay graphs (enabled and on a CUDA device)."""
        return self.enabled and self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:
        return self.flow.dtype

    def flow_key(self, batch: int, frames: int, n_steps: int, cfg_rate: float) -> FlowKey:
        """The graph a flow call of ``batch`` items over ``frames`` frames replays (frame buckets
        are multiples of 64, so of the token-mel ratio too)."""
        meanflow = self.flow.config.meanflow
        return FlowKey(row_bucket(batch), frame_bucket(frames), int(n_steps),
                       self.flow.decoder.guidance(cfg_rate) is not None, meanflow, self.dtype)

    def hift_key(self, batch: int, frames: int) -> HiFTKey:
        return HiFTKey(row_bucket(batch), frame_bucket(frames), self.hift.conv_pre.weight.dtype)

    @torch.inference_mode()
    def run_flow(self, call: FlowCall) -> torch.Tensor:
        """``generate_mel`` of the call: ``[B, 80, ratio L]`` (a view of a graph's output buffer,
        valid until the next flow call, or a fresh tensor)."""
        batch, frames = call.tokens.shape[0], call.cond.shape[2]
        if self._graphed(batch):
            key = self.flow_key(batch, frames, call.n_steps, call.cfg_rate)
            chosen = self.flow_graphs.choose(key)
            if chosen is not None:
                out = self.flow_graphs.replay(chosen, call)
                if out is not None:
                    self.stats.covered_replays += chosen != key
                    return out[:batch, :, :frames]
        self.stats.eager_runs += 1
        return self.flow.generate_mel(call.tokens, call.lengths, call.cond, call.noise, call.speaker, call.n_steps,
                                      self.flow.decoder.guidance(call.cfg_rate))

    @torch.inference_mode()
    def run_hift(self, call: HiFTCall) -> tuple[torch.Tensor, torch.Tensor]:
        """(waveform ``[B, 480 F]``, F0 ``[B, F]``), float32 (views of a graph's buffers, valid until
        the next HiFT call, or fresh tensors)."""
        batch, _, frames = call.mel.shape
        if self._graphed(batch):
            key = self.hift_key(batch, frames)
            chosen = self.hift_graphs.choose(key)
            if chosen is not None:
                out = self.hift_graphs.replay(chosen, call)
                if out is not None:
                    self.stats.covered_replays += chosen != key
                    wav, f0 = out
                    return wav[:batch, :frames * self.hift.config.samples_per_frame], f0[:batch, :frames]
        self.stats.eager_runs += 1
        return self.hift_runner(call.mel, call.counts, call.source)

    def prepare_flow(self, batch: int, frames: int, n_steps: int, cfg_rate: float) -> bool:
        """Capture the flow graph a call of this shape replays, now (warm-up); False when inactive or held."""
        if not self.active:
            return False
        return self.flow_graphs.prepare(self.flow_key(batch, frames, n_steps, cfg_rate))

    def prepare_hift(self, batch: int, frames: int) -> bool:
        if not self.active:
            return False
        return self.hift_graphs.prepare(self.hift_key(batch, frames))

    def capture_due(self) -> bool:
        """Capture one graph a covered shape is due (see the module docstring), the flow's first;
        True when one was captured. Only when no pass runs: the stage calls it when idle."""
        return self.active and (self.flow_graphs.capture_due() or self.hift_graphs.capture_due())

    def clear(self) -> None:
        """Drop every captured graph (the pool's memory goes back once nothing uses it)."""
        self.flow_graphs.clear()
        self.hift_graphs.clear()

    def _graphed(self, batch: int) -> bool:
        return self.active and (self.max_rows is None or batch <= self.max_rows)
