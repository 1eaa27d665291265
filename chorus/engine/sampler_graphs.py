"""CUDA graphs of one engine step's sampling, for a batch composition held in static buffers.

Eager sampling is bound by kernel launches (the counter hash alone is dozens of small integer
kernels), so :class:`SamplerGraphs` captures the whole step as one graph: gathering the
conditional and unconditional rows from the logits, the CFG combine, the EOS ban, the
variant's processors, the noise and argmax race, recording the token in the penalty set, and
advancing the step counters.

* **State.** The composition's parameters, penalty masks, step counters and row indices live in
  static buffers. :meth:`SamplerGraphs.load` writes a new composition there (two host-to-device
  copies from pinned memory, no host sync); every :meth:`SamplerGraphs.sample` replays on them,
  so steady decoding is one logits copy plus one replay. The penalty masks are the runner's
  only copy while loaded: read them back with :attr:`SamplerGraphs.seen` before the next load.
* **Key.** One graph per :class:`GraphKey`: the row bucket (the next power of two >= rows) and
  the batch's host-side signature (active steps, ``max_top_k``, EOS ban, greedy flags,
  unconditional rows, top-p within top-k), which decide which kernels the step runs.
* **Padding.** Rows past the real count carry neutral parameters (greedy, every filter off) and
  index logits row 0. No op mixes rows, so they never change a real row's token; they only
  write their own rows of the static buffers, which the next load rewrites.
* **Memory and streams.** As for the vocoder's solver graphs: one memory pool for all graphs
  (replays run one at a time on the caller's stream and write their result to a static
  buffer), at most ``max_graphs`` graphs (least recently used dropped first), capture on a side
  stream after a warm-up step (on copies of the mutable state), ``thread_local`` capture mode
  so other threads' CUDA work stays legal. A key whose capture fails runs eagerly.

Exactness: a replay runs the eager functions on the padded buffers, and every op works row by
row (the float reductions, softmax and cumsum, pick their kernels by row length; topk, sort and
argmax results do not depend on how the work is split), so each real row gets the eager path's
values. With ``capture=False`` (the default off
CUDA) :meth:`sample` runs that same step eagerly over the static buffers, which is how the CPU
tests check the bookkeeping.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
from torch import Tensor

from chorus import capture_gate
from chorus.models.variants import SamplingStep, Variant
from chorus.sampling import (
    SamplingBatch, SamplingParams, process_logits, record_sampled_tokens, sample_next_tokens,
)
from chorus.t3_sequential import uses_cfg

logger = logging.getLogger(__name__)

# Column order of the packed parameters, and the values of a padded row (greedy, steps off).
_FLOATS = ("cfg_weight", "repetition_penalty", "temperature", "min_p", "top_p_cutoff")
_FLOAT_PAD = (0.0, 1.0, 1.0, 0.0, -1.0)
_INTS = ("top_k", "greedy", "min_new_tokens", "seed_lane0", "seed_lane1", "steps", "cond_index",
         "uncond_index")
_INT_PAD = (0, 1, 0, 0, 0, 0, 0, 0)


def row_bucket(rows: int) -> int:
    """Rows a graph is captured for: the next power of two (1, 2, 4, 8, ...)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    return 1 << (rows - 1).bit_length()


@dataclass(frozen=True)
class GraphKey:
    """What a captured sampling step is specific to."""

    rows: int  # the row bucket
    active_steps: frozenset[SamplingStep]
    max_top_k: int
    bans_eos: bool
    any_greedy: bool
    all_greedy: bool
    has_uncond: bool
    top_p_in_top_k: bool

    @classmethod
    def of(cls, batch: SamplingBatch, has_uncond: bool) -> GraphKey:
        return cls(row_bucket(batch.num_rows), batch.active_steps, batch.max_top_k, batch.bans_eos,
                   batch.any_greedy, batch.all_greedy, has_uncond, batch.top_p_in_top_k)


class SamplerGraphs:
    """Graphed sampling steps over static buffers (see the module docstring).

    ``max_rows``: the most requests one composition may hold (:meth:`fits`). Not thread-safe:
    used from the engine's thread. ``captures`` counts captures (eager stand-ins included).
    """

    def __init__(self, variant: Variant, device: torch.device | str, *, max_rows: int, max_graphs: int = 32,
                 capture: bool | None = None):
        if max_rows < 1 or max_graphs < 1:
            raise ValueError(f"max_rows and max_graphs must be >= 1, got {max_rows}, {max_graphs}")
        self.variant = variant
        self.device = torch.device(device)
        self.capture = self.device.type == "cuda" if capture is None else capture
        assert not self.capture or self.device.type == "cuda", "capturing needs a CUDA device"
        self.max_rows = max_rows
        self.max_graphs = max_graphs
        n, vocab, dev = row_bucket(max_rows), variant.t3.speech_vocab_size, self.device
        self._floats = torch.zeros(n, len(_FLOATS), dtype=torch.float32, device=dev)
        self._ints = torch.zeros(n, len(_INTS), dtype=torch.int64, device=dev)
        self._greedy = torch.ones(n, dtype=torch.bool, device=dev)
        self._seen = torch.zeros(n, vocab, dtype=torch.bool, device=dev)
        self._logits = torch.zeros(2 * n, vocab, dtype=torch.float32, device=dev)  # a CFG pair is 2 rows
        self._tokens = torch.zeros(n, dtype=torch.int64, device=dev)
        self._graphs: OrderedDict[GraphKey, Callable[[], None]] = OrderedDict()
        self._failed: set[GraphKey] = set()
        self._target: capture_gate.CaptureTarget | None = None  # made at the first capture
        self._key: GraphKey | None = None
        self.num_rows = 0
        self.captures = 0

    # -- the loaded composition ----------------------------------------------------------------
    def fits(self, rows: int) -> bool:
        return 1 <= rows <= self.max_rows

    def _column(self, name: str) -> Tensor:
        if name in _FLOATS:
            i = _FLOATS.index(name)
            return self._floats[:, i:i + 1]
        return self._ints[:, _INTS.index(name)]

    @property
    def seen(self) -> Tensor:
        """[R, V] penalty masks of the loaded rows (a view the next load overwrites)."""
        return self._seen[:self.num_rows]

    @property
    def steps(self) -> Tensor:
        """[R] index of the token each loaded row draws next (a view)."""
        return self._column("steps")[:self.num_rows]

    @property
    def keys(self) -> list[GraphKey]:
        """The held graphs' keys, least recently used first."""
        return list(self._graphs)

    @torch.inference_mode()
    def load(self, batch: SamplingBatch, seen: Sequence[Tensor], steps: Sequence[int],
             cond_index: Sequence[int], uncond_index: Sequence[int] | None) -> None:
        """Make a new composition the one :meth:`sample` draws for.

        ``batch``: its parameters (best built on the CPU: they are packed on the host);
        ``seen``: one [1, V] penalty mask per row, on this device; ``steps``: tokens each row's
        request has generated; ``cond_index`` / ``uncond_index``: each row's conditional /
        unconditional row in the logits :meth:`sample` gets (None when no row has one).
        """
        rows = batch.num_rows
        assert self.fits(rows) and len(seen) == len(steps) == len(cond_index) == rows, rows
        assert batch.order == self.variant.sampling.order
        bucket = row_bucket(rows)
        uncond = cond_index if uncond_index is None else uncond_index
        pinned = self.device.type == "cuda"
        floats = torch.empty(bucket, len(_FLOATS), dtype=torch.float32, pin_memory=pinned)
        floats[:rows] = torch.cat([getattr(batch, name).cpu() for name in _FLOATS], dim=1)
        floats[rows:] = torch.tensor(_FLOAT_PAD)
        ints = torch.empty(bucket, len(_INTS), dtype=torch.int64, pin_memory=pinned)
        lanes = batch.seed_lanes.cpu()
        ints[:rows] = torch.stack([
            batch.top_k.cpu(), batch.greedy.cpu().long(), batch.min_new_tokens.cpu(), lanes[:, 0], lanes[:, 1],
            torch.as_tensor(steps), torch.as_tensor(cond_index), torch.as_tensor(uncond)], dim=1)
        ints[rows:] = torch.tensor(_INT_PAD)
        self._floats[:bucket].copy_(floats, non_blocking=True)
        self._ints[:bucket].copy_(ints, non_blocking=True)
        torch.ne(self._column("greedy")[:bucket], 0, out=self._greedy[:bucket])
        torch.cat(list(seen), out=self._seen[:rows])
        self._seen[rows:bucket].zero_()
        self.num_rows = rows
        self._key = GraphKey.of(batch, uncond_index is not None)

    @torch.inference_mode()
    def sample(self, logits: Tensor) -> Tensor:
        """One step for the loaded composition: [R] int64 tokens (``NO_TOKEN`` for a row with no
        finite logit), a view the next call overwrites. ``logits``: [N, V] fp32, the rows that
        ``cond_index`` / ``uncond_index`` of the last :meth:`load` point into. Records the
        tokens in the penalty masks and advances the steps, as the eager path does."""
        key = self._key
        assert key is not None, "load a composition first"
        assert logits.dim() == 2 and logits.shape[0] <= self._logits.shape[0], tuple(logits.shape)
        self._logits[:logits.shape[0]].copy_(logits)
        self._lookup(key)()
        return self._tokens[:self.num_rows]

    def warm_up(self, params: SamplingParams, has_uncond: bool) -> int:
        """Capture the step of every row bucket up to ``max_rows`` for compositions of requests
        sampling with ``params`` (e.g. the variant's defaults; ``has_uncond``: they are CFG
        pairs), so that serving does not capture them the first time its batch grows into each
        bucket: a capture holds the engine's thread, and so every running request's next token,
        for tens of milliseconds. Returns the graphs captured (held ones are not captured again;
        with more buckets than ``max_graphs`` the smallest are dropped again)."""
        before = self.captures
        bucket = 1
        while bucket <= row_bucket(self.max_rows):
            batch = SamplingBatch.build([params] * min(bucket, self.max_rows), self.variant)
            self._lookup(GraphKey.of(batch, has_uncond))
            bucket *= 2
        return self.captures - before

    def warm_up_defaults(self) -> int:
        """:meth:`warm_up` for what requests that set nothing sample with: the variant's
        defaults, and for a variant whose T3 uses CFG those defaults with CFG off as well
        (``cfg_weight=0``: a request's own choice, or a server degrading under load, which is
        when a capture holding every running request's next token hurts most). Returns the
        graphs captured."""
        defaults = SamplingParams.for_variant(self.variant)
        with_cfg = uses_cfg(self.variant, defaults)
        captured = self.warm_up(defaults, has_uncond=with_cfg)
        if with_cfg:
            captured += self.warm_up(replace(defaults, cfg_weight=0.0), has_uncond=False)
        return captured

    # -- the step and its graphs ---------------------------------------------------------------
    def _batch(self, key: GraphKey) -> SamplingBatch:
        """The static buffers' first ``key.rows`` rows as a batch with ``key``'s signature."""
        b = key.rows
        col = {name: self._column(name)[:b] for name in _FLOATS + _INTS}
        return SamplingBatch(
            order=self.variant.sampling.order, eos_token_id=self.variant.t3.stop_speech_token,
            cfg_weight=col["cfg_weight"], repetition_penalty=col["repetition_penalty"],
            temperature=col["temperature"], min_p=col["min_p"], top_k=col["top_k"],
            top_p_cutoff=col["top_p_cutoff"], greedy=self._greedy[:b], min_new_tokens=col["min_new_tokens"],
            seed_lanes=self._ints[:b, _INTS.index("seed_lane0"):_INTS.index("seed_lane1") + 1],
            active_steps=key.active_steps, max_top_k=key.max_top_k, bans_eos=key.bans_eos,
            any_greedy=key.any_greedy, all_greedy=key.all_greedy, top_p_in_top_k=key.top_p_in_top_k,
        )

    def _step(self, key: GraphKey, seen: Tensor, steps: Tensor, tokens: Tensor) -> None:
        """The eager step over ``key.rows`` rows: what a graph captures. ``seen``, ``steps`` and
        ``tokens`` are passed in so a warm-up can run on copies."""
        batch = self._batch(key)
        cond = self._logits.index_select(0, self._column("cond_index")[:key.rows])
        uncond = self._logits.index_select(0, self._column("uncond_index")[:key.rows]) if key.has_uncond else None
        processed = process_logits(cond, batch, seen, steps, uncond_logits=uncond)
        drawn = sample_next_tokens(processed, batch, steps)
        record_sampled_tokens(self.variant, seen, drawn, steps)
        steps.add_(1)
        tokens.copy_(drawn)

    def _static_step(self, key: GraphKey) -> None:
        b = key.rows
        self._step(key, self._seen[:b], self._column("steps")[:b], self._tokens[:b])

    def _lookup(self, key: GraphKey) -> Callable[[], None]:
        """The held step of ``key`` (now the most recently used), captured if missing."""
        run = self._graphs.get(key)
        if run is not None:
            self._graphs.move_to_end(key)
            return run
        if key in self._failed:
            return lambda: self._static_step(key)
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)
            if self.capture:  # no replay of the dropped graph may still be in flight
                capture_gate.synchronize(self.device)
        try:
            run = self._capture(key) if self.capture else (lambda: self._static_step(key))
        except Exception:  # e.g. out of memory: this key samples eagerly from now on
            logger.warning("capturing the sampler's CUDA graph for %s failed; sampling it eagerly", key,
                           exc_info=True)
            self._failed.add(key)
            return lambda: self._static_step(key)
        self.captures += 1
        self._graphs[key] = run
        return run

    def _capture(self, key: GraphKey) -> Callable[[], None]:
        b, device = key.rows, self.device
        with torch.cuda.device(device):
            if self._target is None:
                self._target = capture_gate.CaptureTarget(device)
            current, side = torch.cuda.current_stream(device), self._target.stream
            side.wait_stream(current)
            with torch.cuda.stream(side):  # warm-up outside capture, on copies of the mutable state
                self._step(key, self._seen[:b].clone(), self._column("steps")[:b].clone(),
                           torch.empty_like(self._tokens[:b]))
            graph = torch.cuda.CUDAGraph()
            with self._target.capture(graph):
                self._static_step(key)
            current.wait_stream(side)
        return graph.replay
