"""CUDA graphs of the flow-matching solver, the launch-bound part of a vocoder pass.

One solve is ``n_steps`` estimator calls of a few hundred small kernels each; for the short
windows of streaming passes a GPU spends most of that time waiting for Python to launch them.
:class:`GraphedSolver` is called like ``ConditionalFlowMatching.solve`` and, on CUDA, replays one
captured graph holding the whole Euler loop (every step, the CFG rows and their combine).

* **Buckets.** A graph has fixed shapes, so a call is padded up to a bucket: rows (items) to the
  next power of two (:func:`row_bucket`), frames to :func:`frame_bucket` (multiples of 64 up to
  1024 frames, then 8 buckets per doubling, so padding stays under 1/8 of the frames). Padded
  rows and frames carry a False mask and zero inputs; the estimator never lets a valid frame see
  them (causal convs over masked inputs, attention masking padded keys, per-frame norms, and no
  op mixes rows), so the valid outputs are those of the unpadded solve up to the rounding of
  kernels chosen for other shapes. Padded rows may hold anything (a row with no valid key);
  they are cut off.
* **Key.** One graph per :class:`SolverKey` (row bucket, frame bucket, steps, guided, meanflow,
  dtype). The CFG weight is not part of it: it is read from a device tensor that is filled
  before each replay. The flow-time grid depends only on the steps, so it is computed inside.
* **Memory.** All graphs share one memory pool for their intermediates (safe here: replays run
  one at a time, on one stream, and each replay's output is copied out before the next one);
  each graph owns its static inputs and output. At most ``max_graphs`` graphs are kept, the
  least recently used is dropped first.
* **Streams.** Inputs are copied into the static buffers on the caller's current stream and the
  graph is replayed on that stream, so the copies are ordered before the replay. Capture runs on
  a dedicated side stream (the legacy default stream cannot be captured, and the pool is best
  reused from one capture stream), after a warm-up solve on that stream as PyTorch asks, and is
  ordered after the caller's stream and before its later work with ``wait_stream``. The capture
  mode is ``thread_local`` so that another thread's CUDA calls (T3's) stay legal meanwhile.

On the CPU, or when disabled, a call is the eager ``solve`` itself.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from chorus.models.s3gen.flow_matching import ConditionalFlowMatching
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


@dataclass(frozen=True)
class SolverKey:
    """What a captured graph is specific to."""

    rows: int
    frames: int
    n_steps: int
    guided: bool
    meanflow: bool
    dtype: torch.dtype


def solver_key(batch: int, frames: int, n_steps: int, cfg_rate: float, meanflow: bool,
               dtype: torch.dtype) -> SolverKey:
    """The graph a solve of ``batch`` items over ``frames`` frames replays."""
    return SolverKey(row_bucket(batch), frame_bucket(frames), int(n_steps),
                     not meanflow and cfg_rate != 0.0, bool(meanflow), dtype)


class SolverInputs:
    """The static buffers of one key's graph: the solver's inputs padded to the bucket, and the
    CFG weights as float32 device scalars."""

    def __init__(self, key: SolverKey, device: torch.device):
        rows, frames, like = key.rows, key.frames, dict(device=device, dtype=key.dtype)
        self.key = key
        self.noise = torch.zeros(rows, 80, frames, **like)
        self.mu = torch.zeros(rows, 80, frames, **like)
        self.cond = torch.zeros(rows, 80, frames, **like)
        self.spks = torch.zeros(rows, 80, **like)
        self.mask = torch.zeros(rows, frames, dtype=torch.bool, device=device)
        weights = dict(device=device, dtype=torch.float32)
        self.weights = (torch.zeros((), **weights), torch.zeros((), **weights)) if key.guided else None

    def load(self, noise: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor,
             cond: torch.Tensor, cfg_rate: float) -> None:
        """Copy a call's inputs in (on the current stream); padding gets zeros and a False mask."""
        batch, _, frames = noise.shape
        for static, value in ((self.noise, noise), (self.mu, mu), (self.cond, cond)):
            _pad_zero(static, batch, frames)
            static[:batch, :, :frames].copy_(value)
        _pad_zero(self.mask, batch, frames)
        self.mask[:batch, :frames].copy_(mask)
        if batch < self.key.rows:
            self.spks[batch:].zero_()
        self.spks[:batch].copy_(spks)
        if self.weights is not None:  # as solve: v = (1 + w) v(cond) - w v(uncond)
            self.weights[0].fill_(1.0 + cfg_rate)
            self.weights[1].fill_(cfg_rate)

    def run(self, cfm: ConditionalFlowMatching) -> torch.Tensor:
        """The solve over the whole buffers: what the graph captures (``[rows, 80, frames]``)."""
        return cfm.integrate(self.noise, self.mask, self.mu, self.spks, self.cond, self.key.n_steps,
                             guidance=self.weights)


def _pad_zero(static: torch.Tensor, batch: int, frames: int) -> None:
    """Zero a static buffer ``[rows, (80,) frames]`` outside its first ``batch`` rows and ``frames`` frames."""
    if batch < static.shape[0]:
        static[batch:].zero_()
    if frames < static.shape[-1]:
        static[:batch, ..., frames:].zero_()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: SolverInputs
    output: torch.Tensor


class GraphedSolver:
    """``ConditionalFlowMatching.solve`` through captured CUDA graphs (see the module docstring).

    Not thread-safe: used from the vocoder stage's thread. ``stats`` receives ``graph_replays``,
    ``graph_captures``, ``graph_capture_seconds`` and ``eager_solves``.
    """

    def __init__(self, cfm: ConditionalFlowMatching, *, enabled: bool = True, max_graphs: int = 64,
                 max_rows: int | None = None, capture_after: int = 1, stats: VocoderStats | None = None):
        """``max_rows``: solves of more items run eagerly (None: no limit). ``capture_after``: a
        key is captured on its ``capture_after``-th call (earlier calls solve eagerly);
        :meth:`prepare` captures at once."""
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        if capture_after < 1:
            raise ValueError(f"capture_after must be >= 1, got {capture_after}")
        self.cfm = cfm
        self.enabled = enabled
        self.max_graphs = max_graphs
        self.max_rows = max_rows
        self.capture_after = capture_after
        self._calls: dict[SolverKey, int] = {}  # calls of keys not captured yet
        self.stats = stats if stats is not None else VocoderStats()
        self._graphs: OrderedDict[SolverKey, _Graph] = OrderedDict()
        self._failed: set[SolverKey] = set()  # keys whose capture raised: solved eagerly
        self._pool = None
        self._stream: torch.cuda.Stream | None = None

    @property
    def device(self) -> torch.device:
        return self.cfm.estimator.final_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.cfm.estimator.final_proj.weight.dtype

    @property
    def active(self) -> bool:
        """Whether calls replay graphs (enabled and on a CUDA device)."""
        return self.enabled and self.device.type == "cuda"

    @property
    def keys(self) -> list[SolverKey]:
        """The captured graphs' keys, least recently used first."""
        return list(self._graphs)

    def key(self, batch: int, frames: int, n_steps: int, cfg_rate: float) -> SolverKey:
        return solver_key(batch, frames, n_steps, cfg_rate, self.cfm.meanflow, self.dtype)

    def __call__(self, noise: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor,
                 cond: torch.Tensor, n_steps: int, cfg_rate: float) -> torch.Tensor:
        """The same call and result as ``ConditionalFlowMatching.solve`` (a fresh tensor)."""
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        batch, _, frames = noise.shape
        entry = None
        if self.active and (self.max_rows is None or batch <= self.max_rows):
            key = self.key(batch, frames, n_steps, cfg_rate)
            if key not in self._failed and self.wants(key):
                entry = self._lookup(key)
        if entry is None:
            self.stats.eager_solves += 1
            return self.cfm.solve(noise, mask, mu, spks, cond, n_steps=n_steps, cfg_rate=cfg_rate)
        with torch.inference_mode(), torch.cuda.device(self.device):
            entry.inputs.load(noise, mask, mu, spks, cond, cfg_rate)
            entry.graph.replay()
            self.stats.graph_replays += 1
            return entry.output[:batch, :, :frames].clone()

    def wants(self, key: SolverKey) -> bool:
        """Count a call of ``key``: True when its graph is held or this call should capture it."""
        if key in self._graphs:
            return True
        calls = self._calls.get(key, 0) + 1
        if calls >= self.capture_after:
            self._calls.pop(key, None)
            return True
        self._calls[key] = calls
        return False

    def prepare(self, key: SolverKey) -> bool:
        """Capture the graph of ``key`` now unless it is held (or failed before); True when it
        was captured by this call. Does nothing when inactive."""
        if not self.active or key in self._graphs or key in self._failed:
            return False
        return self._lookup(key) is not None

    def clear(self) -> None:
        """Drop every captured graph (the pool's memory goes back once nothing uses it)."""
        if self._graphs and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._graphs.clear()

    # -------------------------------------------------------------------------------- internals
    def _lookup(self, key: SolverKey) -> _Graph | None:
        """The held graph of ``key`` (now the most recently used), captured if missing, evicting
        the least recently used past ``max_graphs``; None when its capture failed."""
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry
        while len(self._graphs) >= self.max_graphs:
            self._evict()
        started = time.perf_counter()
        try:
            entry = self._capture(key)
        except Exception:  # e.g. out of memory: this shape runs eagerly from now on
            logger.warning("capturing the flow solver's CUDA graph for %s failed; solving it eagerly",
                           key, exc_info=True)
            self._failed.add(key)
            return None
        self.stats.graph_captures += 1
        self.stats.graph_capture_seconds += time.perf_counter() - started
        self._graphs[key] = entry
        return entry

    def _evict(self) -> None:
        key, _ = self._graphs.popitem(last=False)
        logger.debug("dropping the flow solver's CUDA graph for %s", key)
        # Its buffers may have been allocated on another stream than the replays ran on; make
        # sure no replay still reads them before the allocator can hand them out again.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def _capture(self, key: SolverKey) -> _Graph:
        device = self.device
        with torch.cuda.device(device):
            if self._stream is None:
                self._pool = torch.cuda.graph_pool_handle()
                self._stream = torch.cuda.Stream(device)
            current = torch.cuda.current_stream(device)
            inputs = SolverInputs(key, device)  # zeroed on the current stream
            side = self._stream
            side.wait_stream(current)
            with torch.cuda.stream(side):
                inputs.run(self.cfm)  # warm-up: lazy initialisation (cuBLAS, kernels) outside capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                output = inputs.run(self.cfm)
            current.wait_stream(side)
        return _Graph(graph, inputs, output)
