"""What the scheduler hands the model runner for one step (and how it is laid out from the
scheduled spans: ``build_output``, ``decode_output``), and what a request gets back.

A step's rows are kept as numpy arrays (one entry per row), so the model runner assembles its
inputs without a Python loop over rows; ``SchedulerOutput.rows`` gives the same rows as objects
for callers that want them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from chorus.engine.request import Branch, FinishReason, Request, Sequence

if TYPE_CHECKING:
    import torch


class RequestOutput(NamedTuple):
    """What one request got from a step: a new token (None when it stopped on EOS or ended
    without sampling) and, if it finished, why; for a request that wants alignment, the new
    token's alignment row [framed text positions] on the host (set by the engine). (A named
    tuple: one is made per request per step.)"""

    request_id: str
    new_token: int | None
    finish_reason: FinishReason | None = None
    error: str | None = None
    alignment: "torch.Tensor | None" = None


class ScheduledSequence:
    """One row of the batch: compute positions ``[start, start + num_tokens)`` of ``seq_id``,
    whose KV lives in ``block_table``; ``needs_logits`` when the span ends the sequence (last
    prompt chunk or a decode), i.e. a token is sampled from its last position. Built on demand
    by ``SchedulerOutput.rows``; read-only."""

    __slots__ = ("_output", "_index", "seq_id", "request_id", "branch", "start", "num_tokens", "needs_logits")

    def __init__(self, output: SchedulerOutput, index: int, seq: Sequence, start: int, num_tokens: int,
                 needs_logits: bool):
        self._output, self._index = output, index
        self.seq_id, self.request_id, self.branch = seq.seq_id, seq.request_id, seq.branch
        self.start, self.num_tokens, self.needs_logits = start, num_tokens, needs_logits

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def block_table(self) -> tuple[int, ...]:
        out, i = self._output, self._index
        return tuple(out.block_tables[i, :out.table_lengths[i]].tolist())

    def __repr__(self) -> str:
        return (f"ScheduledSequence({self.seq_id}, start={self.start}, num_tokens={self.num_tokens}, "
                f"needs_logits={self.needs_logits})")


@dataclass(eq=False)  # identity: the arrays have no single truth value
class SchedulerOutput:
    """One step's work. Rows are in batch order: single-position spans (decode) first, both
    rows of a CFG pair adjacent (conditional, then unconditional).

    Row i computes positions ``[row_starts[i], row_starts[i] + row_num_tokens[i])`` of
    ``seqs[i]``, whose KV lives in blocks ``block_tables[i, :table_lengths[i]]`` (the table as
    it was when scheduled; zero-padded to the longest); ``row_needs_logits[i]`` when the span
    ends the sequence. The arrays are this step's own copies.
    """

    requests: dict[str, Request]  # scheduled requests, in batch order
    num_scheduled_tokens: dict[str, int]  # per request, per row
    seqs: list[Sequence]
    row_starts: np.ndarray  # [rows] int64
    row_num_tokens: np.ndarray  # [rows] int64
    row_needs_logits: np.ndarray  # [rows] bool
    block_tables: np.ndarray  # [rows, longest table] int32
    table_lengths: np.ndarray  # [rows] int64
    preempted: list[str] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)  # ended while scheduling

    @cached_property
    def rows(self) -> list[ScheduledSequence]:
        return list(map(ScheduledSequence, repeat(self), range(len(self.seqs)), self.seqs,
                        self.row_starts.tolist(), self.row_num_tokens.tolist(), self.row_needs_logits.tolist()))

    @property
    def total_num_tokens(self) -> int:
        return int(self.row_num_tokens.sum())

    @property
    def num_decode_rows(self) -> int:
        """Rows computing one position: the decodes (a one-position prompt chunk counts too)."""
        return int((self.row_num_tokens == 1).sum())

    @property
    def num_prefill_tokens(self) -> int:
        """Positions of the other rows: prompt chunks and recomputes (0 in a steady decode step)."""
        return self.total_num_tokens - self.num_decode_rows

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    def cfg_pairs(self) -> list[tuple[int, int]]:
        """Row indices (conditional, unconditional) of each CFG pair in the batch."""
        return [(i - 1, i) for i, seq in enumerate(self.seqs) if seq.branch is Branch.UNCOND]

    def logits_rows(self) -> list[int]:
        """Indices of the rows whose last position's logits are needed."""
        return np.flatnonzero(self.row_needs_logits).tolist()


BlockTablesOf = Callable[[list[Sequence]], tuple[np.ndarray, np.ndarray]]
"""``KVCacheManager.block_tables``: the zero-padded block tables of some sequences and their lengths."""


def build_output(requests: Mapping[str, Request], scheduled: dict[str, int], preempted: list[str],
                 finished: list[RequestOutput], block_tables: BlockTablesOf,
                 in_flight: Mapping[str, int] | None = None) -> SchedulerOutput:
    """The step of ``scheduled`` (request id -> positions, each id in ``requests``).
    ``in_flight``: positions per request of the step in flight, for a step scheduled ahead of
    its commit (a request in it computes from there on, and the token it samples there is one
    more of its sequence)."""
    # decode first, each group in the order scheduled
    order = [rid for rid, n in scheduled.items() if n == 1] + [rid for rid, n in scheduled.items() if n > 1]
    chosen = [requests[rid] for rid in order]
    counts = np.fromiter((scheduled[rid] for rid in order), np.int64, len(order))
    firsts = [r.sequences[0] for r in chosen]
    ahead = np.fromiter(((in_flight or {}).get(rid, 0) for rid in order), np.int64, len(order))
    starts = np.fromiter((s.num_computed_tokens for s in firsts), np.int64, len(order)) + ahead
    ends = np.fromiter((s.num_tokens for s in firsts), np.int64, len(order)) + (ahead > 0)
    rows = np.fromiter((len(r.sequences) for r in chosen), np.int64, len(order))
    seqs = [seq for r in chosen for seq in r.sequences]
    tables, lengths = block_tables(seqs)
    return SchedulerOutput(
        requests=dict(zip(order, chosen)), num_scheduled_tokens=dict(zip(order, counts.tolist())),
        seqs=seqs, row_starts=np.repeat(starts, rows), row_num_tokens=np.repeat(counts, rows),
        row_needs_logits=np.repeat(starts + counts == ends, rows), block_tables=tables,
        table_lengths=lengths, preempted=preempted, finished=finished,
    )


def decode_output(decoding: list[Request], starts: np.ndarray, finished: list[RequestOutput],
                  block_tables: BlockTablesOf) -> SchedulerOutput:
    """``build_output`` for a step of exactly the decoding requests, one position each from
    ``starts`` (per request)."""
    ids = [r.request_id for r in decoding]
    rows = np.fromiter((len(r.sequences) for r in decoding), np.int64, len(decoding))
    seqs = [seq for r in decoding for seq in r.sequences]
    tables, lengths = block_tables(seqs)
    return SchedulerOutput(
        requests=dict(zip(ids, decoding)), num_scheduled_tokens=dict.fromkeys(ids, 1), seqs=seqs,
        row_starts=np.repeat(starts, rows), row_num_tokens=np.ones(len(seqs), np.int64),
        row_needs_logits=np.ones(len(seqs), bool), block_tables=tables, table_lengths=lengths,
        finished=finished,
    )
