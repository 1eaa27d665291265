"""Continuous batching for T3: which positions of which rows the next forward computes.

One engine step is ``out = scheduler.schedule()``, the model runner computes ``out.rows`` and
samples one token per request whose logits were needed, then
``scheduler.update_from_output(out, sampled)``. Per step:

1. Requests past their deadline finish (``out.finished``) and free their blocks.
2. Running requests get their next span: decode rows (one position) first, then unfinished
   prefills, each group by priority then arrival. When the pool is out of blocks the
   lowest-priority, newest running request is preempted (both rows of a CFG pair, all blocks
   freed) and goes back to the waiting queue with its generated tokens; it is recomputed later.
3. If nothing was preempted, waiting requests are admitted in priority order (FIFO within a
   level) while rows (``max_num_seqs``), the token budget (``max_num_batched_tokens``, a
   prompt is chunked to fit) and blocks allow; a waiting request may preempt running requests
   of strictly lower priority. Admission stops at the first request that does not fit.

The two rows of a CFG pair always get the same span, both count against the budget, and they
sit next to each other in the batch (conditional first).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from chorus.engine.block_pool import PoolMetrics
from chorus.engine.config import SchedulerConfig
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.request import Branch, FinishReason, Request, RequestQueue, RequestStatus


class AdmissionError(ValueError):
    """The request can never run under this configuration; it was not queued."""


@dataclass(frozen=True)
class ScheduledSequence:
    """One row of the batch: compute positions ``[start, start + num_tokens)`` of ``seq_id``,
    whose KV lives in ``block_table``; ``needs_logits`` when the span ends the sequence (last
    prompt chunk or a decode), i.e. a token is sampled from its last position."""

    seq_id: str
    request_id: str
    branch: Branch
    start: int
    num_tokens: int
    block_table: tuple[int, ...]
    needs_logits: bool

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class RequestOutput:
    """What one request got from a step: a new token (None when it stopped on EOS or ended
    without sampling) and, if it finished, why."""

    request_id: str
    new_token: int | None
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass
class SchedulerOutput:
    """One step's work. ``rows`` is the batch order: single-position spans (decode) first,
    both rows of a CFG pair adjacent (conditional, then unconditional)."""

    rows: list[ScheduledSequence]
    requests: dict[str, Request]  # scheduled requests, in batch order
    num_scheduled_tokens: dict[str, int]  # per request, per row
    preempted: list[str] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)  # ended while scheduling

    @property
    def total_num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)

    @property
    def is_empty(self) -> bool:
        return not self.rows

    def cfg_pairs(self) -> list[tuple[int, int]]:
        """Row indices (conditional, unconditional) of each CFG pair in the batch."""
        return [(i - 1, i) for i, row in enumerate(self.rows) if row.branch is Branch.UNCOND]

    def logits_rows(self) -> list[int]:
        """Indices of the rows whose last position's logits are needed."""
        return [i for i, row in enumerate(self.rows) if row.needs_logits]


@dataclass(frozen=True)
class SchedulerStats:
    num_waiting: int
    num_running: int
    num_running_rows: int
    num_preemptions: int
    kv: PoolMetrics


class Scheduler:
    """Owns the waiting queue and the running set; the only writer of request state."""

    def __init__(
        self, config: SchedulerConfig, kv_cache: KVCacheManager,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.kv = kv_cache
        self.clock = clock
        self.waiting = RequestQueue()
        self.running: list[Request] = []
        self._requests: dict[str, Request] = {}
        self._in_flight: SchedulerOutput | None = None
        self.num_preemptions = 0

    # -- user edge -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request. Raises ``AdmissionError`` (nothing allocated, nothing queued)
        if it could never run: longer than ``max_model_len`` or than the whole KV pool."""
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if request.status is not RequestStatus.WAITING or request.output_tokens:
            raise ValueError(f"request {request.request_id!r} was already scheduled once")
        self._check_admissible(request)
        self._requests[request.request_id] = request
        self.waiting.push(request)

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORTED, error: str | None = None
    ) -> RequestOutput | None:
        """Finish a waiting or running request now and free all its blocks. Returns None for an
        unknown (or already finished) id."""
        request = self._requests.get(request_id)
        if request is None:
            return None
        self._finish(request, reason, error)
        return RequestOutput(request_id, None, reason, error)

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def unfinished_request_ids(self) -> list[str]:
        """Ids of every waiting or running request."""
        return list(self._requests)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_waiting=len(self.waiting), num_running=len(self.running),
            num_running_rows=self._running_rows(), num_preemptions=self.num_preemptions,
            kv=self.kv.metrics(),
        )

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's rows and spans and allocate their slots (see module docstring)."""
        assert self._in_flight is None, "schedule() called again before update_from_output()"
        finished = self._expire_deadlines()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        preempted: list[str] = []

        def preempt(victim: Request) -> None:
            nonlocal budget
            budget += scheduled.pop(victim.request_id, 0) * victim.num_rows
            self._preempt(victim)
            preempted.append(victim.request_id)

        decode_first = sorted(self.running, key=lambda r: (self._remaining(r) > 1, r.sort_key()))
        for request in decode_first:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(self._remaining(request), budget // request.num_rows)
            if n <= 0:
                continue
            while request.status is RequestStatus.RUNNING:
                if self.kv.allocate_slots(request, n) is not None:
                    scheduled[request.request_id] = n
                    budget -= n * request.num_rows
                    break
                preempt(max(self.running, key=Request.sort_key))

        out_of_blocks = bool(preempted)
        while not out_of_blocks and self.waiting:
            request = self.waiting.peek()
            if request.request_id in preempted:
                break  # preempted for a higher priority this very step: not back before the next
            if self._running_rows() + request.num_rows > self.config.max_num_seqs:
                break
            computed = self.kv.get_computed_blocks(request)
            remaining = request.num_tokens - computed.num_tokens
            n = min(remaining, budget // request.num_rows)
            if n <= 0 or (n < remaining and not self.config.enable_chunked_prefill):
                break
            if self.kv.allocate_slots(request, n, computed) is None:
                victim = self._lower_priority_victim(request)
                if victim is None:
                    break
                preempt(victim)
                continue
            self.waiting.pop()
            request.set_status(RequestStatus.RUNNING)
            self.running.append(request)
            scheduled[request.request_id] = n
            budget -= n * request.num_rows

        out = self._build_output(scheduled, preempted, finished)
        self._in_flight = out
        return out

    def update_from_output(self, output: SchedulerOutput, sampled: Mapping[str, int]) -> list[RequestOutput]:
        """Commit the step: advance computed positions, register newly full blocks in the prefix
        cache, append each sampled token (``sampled[request_id]`` for every request whose
        logits were needed), stop on EOS / ``max_tokens`` and free finished requests."""
        assert output is self._in_flight, "update_from_output() must get the last schedule() output"
        self._in_flight = None
        results = []
        for request_id, n in output.num_scheduled_tokens.items():
            request = output.requests[request_id]
            if request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran; its blocks are already free
            for seq in request.sequences:
                seq.num_computed_tokens += n
                self.kv.cache_computed_blocks(seq)
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            if request_id not in sampled:
                raise KeyError(f"no sampled token for request {request_id!r}, whose logits were computed")
            token = int(sampled[request_id])
            reason = self._stop_reason(request, token)
            if reason is not FinishReason.EOS:
                request.append_output(token)
            if reason is not None:
                self._finish(request, reason)
            results.append(RequestOutput(request_id, None if reason is FinishReason.EOS else token, reason))
        return results

    # -- internals -----------------------------------------------------------------------------
    def _check_admissible(self, request: Request) -> None:
        p, cfg = request.prompt, self.config
        total = request.max_total_tokens()
        if total > cfg.max_model_len:
            raise AdmissionError(
                f"request {request.request_id!r}: the prompt has {p.num_tokens} positions "
                f"({p.cond_len} conditioning + {len(p.text_ids)} text + {p.bos_copies} BOS) and "
                f"max_tokens is {request.max_tokens}: {total} positions exceed max_model_len="
                f"{cfg.max_model_len}; shorten the text or lower max_tokens")
        blocks = request.num_rows * self.kv.num_blocks_for(total)
        if blocks > self.kv.pool.num_blocks:
            raise AdmissionError(
                f"request {request.request_id!r} may need {blocks} KV blocks ({request.num_rows} "
                f"row(s) of {total} positions) but the cache has {self.kv.pool.num_blocks}; "
                f"lower max_tokens or shorten the text")
        if not cfg.enable_chunked_prefill and request.num_rows * total > cfg.max_num_batched_tokens:
            raise AdmissionError(
                f"request {request.request_id!r}: {request.num_rows} row(s) of up to {total} "
                f"positions do not fit max_num_batched_tokens={cfg.max_num_batched_tokens} "
                f"without chunked prefill")
        if request.num_rows > cfg.max_num_seqs:
            raise AdmissionError(f"a CFG request needs 2 rows but max_num_seqs={cfg.max_num_seqs}")

    def _remaining(self, request: Request) -> int:
        return request.num_tokens - request.num_computed_tokens

    def _running_rows(self) -> int:
        return sum(r.num_rows for r in self.running)

    def _lower_priority_victim(self, request: Request) -> Request | None:
        """The lowest-priority, newest running request of strictly lower priority, if any."""
        lower = [r for r in self.running if r.priority > request.priority]
        return max(lower, key=Request.sort_key) if lower else None

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.kv.free(victim)  # every block of both rows; generated tokens stay on the request
        victim.set_status(RequestStatus.PREEMPTED)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(victim)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.kv.free(request)
        request.finish(reason, error)
        del self._requests[request.request_id]

    def _expire_deadlines(self) -> list[RequestOutput]:
        now = self.clock()
        expired = [r for r in self._requests.values() if r.deadline is not None and r.deadline <= now]
        for request in expired:
            self._finish(request, FinishReason.DEADLINE, "deadline exceeded")
        return [RequestOutput(r.request_id, None, FinishReason.DEADLINE, r.error) for r in expired]

    @staticmethod
    def _stop_reason(request: Request, token: int) -> FinishReason | None:
        produced = len(request.output_tokens)  # before this token
        if token == request.prompt.eos_token and not request.ignore_eos and produced >= request.min_tokens:
            return FinishReason.EOS
        if produced + 1 >= request.max_tokens:
            return FinishReason.LENGTH
        return None

    def _build_output(
        self, scheduled: dict[str, int], preempted: list[str], finished: list[RequestOutput]
    ) -> SchedulerOutput:
        order = sorted(scheduled, key=lambda rid: scheduled[rid] > 1)  # stable: decode first
        rows = []
        for request_id in order:
            request, n = self._requests[request_id], scheduled[request_id]
            start = request.num_computed_tokens
            for seq in request.sequences:
                rows.append(ScheduledSequence(
                    seq_id=seq.seq_id, request_id=request_id, branch=seq.branch, start=start,
                    num_tokens=n, block_table=tuple(self.kv.block_table(seq.seq_id)),
                    needs_logits=start + n == request.num_tokens,
                ))
        return SchedulerOutput(
            rows=rows, requests={rid: self._requests[rid] for rid in order},
            num_scheduled_tokens={rid: scheduled[rid] for rid in order},
            preempted=preempted, finished=finished,
        )

    def check_invariants(self) -> None:
        """Assert the scheduler's and the cache's consistency (for tests)."""
        self.kv.check_invariants()
        assert self._running_rows() <= self.config.max_num_seqs
        waiting = list(self.waiting)
        assert {r.request_id for r in self.running} | {r.request_id for r in waiting} == set(self._requests)
        assert len(self.running) + len(waiting) == len(self._requests)
        for request in self.running:
            assert request.status is RequestStatus.RUNNING, request
            assert len({s.num_computed_tokens for s in request.sequences}) == 1, request
            for seq in request.sequences:
                self.kv.check_sequence(seq)
        for request in waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), request
            assert request.num_computed_tokens == 0, request
            assert all(not self.kv.block_table(s.seq_id) for s in request.sequences), request
