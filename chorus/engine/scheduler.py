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

Besides the token budget, a step's prefill positions (prompt chunks and admissions, never the
decode rows) are bounded by time: what ``step_cost`` predicts fits in ``step_time_target_s``
beside the decode rows (``prefill_time_budget``; docs/engine.md, "Step time"). And where the
engine gives a ``PrefillShape`` (the largest step its mixed CUDA graphs hold), a step with decode
rows takes at most that many prompt rows and positions, so that it replays a graph.
"""
from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from chorus.engine.admission import AdmissionError, check_admissible
from chorus.engine.block_pool import PoolMetrics
from chorus.engine.config import SchedulerConfig
from chorus.engine.intmath import cdiv
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.request import FinishReason, Request, RequestQueue, RequestStatus
from chorus.engine.scheduler_output import (RequestOutput, ScheduledSequence, SchedulerOutput, build_output,
                                            decode_output)
from chorus.engine.step_budget import PrefillShape, prefill_time_budget, within_prefill_shape
from chorus.engine.step_cost import StepCostModel

__all__ = ["AdmissionError", "PrefillShape", "RequestOutput", "ScheduledSequence", "Scheduler", "SchedulerOutput",
           "SchedulerStats"]


@dataclass(frozen=True)
class SchedulerStats:
    num_waiting: int
    num_running: int
    num_running_rows: int
    num_preemptions: int
    kv: PoolMetrics


class Scheduler:
    """Owns the waiting queue and the running set; the only writer of request state.

    ``running`` is kept in scheduling order (``Request.sort_key``). A running request with one
    position left is *decoding*; the others (a prompt, or a recompute after preemption, still
    being prefilled) are tracked in ``_prefilling``. In a step without prefills and with enough
    free blocks, the decode rows are scheduled by numpy over the running set: a row needs a new
    block only when its next position starts one.
    """

    def __init__(
        self, config: SchedulerConfig, kv_cache: KVCacheManager,
        clock: Callable[[], float] = time.monotonic, *, step_time_target_s: float = math.inf,
        prefill_shape: PrefillShape | None = None,
    ):
        """``step_time_target_s``: seconds a step's predicted time should stay under (the
        engine resolves ``config.step_time_target_s`` for its device; inf: no time bound). The
        caller times steps and feeds ``step_cost`` (``StepCostModel.observe``).
        ``prefill_shape``: the most prompt rows and positions beside decode rows (None: no bound
        but the others)."""
        self.config = config
        self.step_time_target_s = step_time_target_s
        self.prefill_shape = prefill_shape
        self.step_cost = StepCostModel()
        self.kv = kv_cache
        self.clock = clock
        self.waiting = RequestQueue()
        self.running: list[Request] = []
        self.num_running_rows = 0
        self._prefilling: set[Request] = set()
        self._requests: dict[str, Request] = {}
        self._deadlines: list[tuple[float, int, Request]] = []  # heap; finished entries skipped
        self._in_flight: list[SchedulerOutput] = []  # scheduled, not yet committed; oldest first
        # admit_ahead: a step ahead found the pool short for a waiting request, so the next step
        # is schedule()'s, which may preempt for it
        self._needs_regular_schedule = False
        self.num_preemptions = 0

    # -- user edge -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request. Raises ``AdmissionError`` (nothing allocated, nothing queued)
        if it could never run: longer than ``max_model_len`` or than the whole KV pool."""
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if request.status is not RequestStatus.WAITING or request.output_tokens:
            raise ValueError(f"request {request.request_id!r} was already scheduled once")
        check_admissible(request, self.config, self.kv)
        self._requests[request.request_id] = request
        self.waiting.push(request)
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, request.arrival_order, request))

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

    @property
    def num_prefilling(self) -> int:
        """Running requests with prompt positions (or a recompute) still to compute."""
        return len(self._prefilling)

    def unfinished_request_ids(self) -> list[str]:
        """Ids of every waiting or running request."""
        return list(self._requests)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_waiting=len(self.waiting), num_running=len(self.running),
            num_running_rows=self.num_running_rows, num_preemptions=self.num_preemptions,
            kv=self.kv.metrics(),
        )

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's rows and spans and allocate their slots (see module docstring)."""
        assert not self._in_flight, "schedule() called again before update_from_output()"
        self._needs_regular_schedule = False
        finished = self._expire_deadlines()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        preempted: list[str] = []

        def preempt(victim: Request) -> int:
            """Preempt ``victim``; returns the budget its positions in this step give back."""
            self._preempt(victim)
            preempted.append(victim.request_id)
            return scheduled.pop(victim.request_id, 0) * victim.num_rows

        def make_room(request: Request) -> int | None:
            victim = self._lower_priority_victim(request)
            return None if victim is None else preempt(victim)

        if self._prefilling:
            decoding = [r for r in self.running if r not in self._prefilling]
            prefilling = [r for r in self.running if r in self._prefilling]
        else:
            decoding, prefilling = list(self.running), []  # a copy: admission inserts into running
        decode_starts = self._allocate_decode_slots(decoding)
        # prefill positions that fit the step-time target beside the decode rows (which always
        # run); the steady decode step (nothing prefilling or waiting) has no use for them
        prefill_time, prefill_rows = 0, math.inf
        if prefilling or self.waiting or decode_starts is None:
            prefill_time = self.prefill_time_budget(self.num_running_rows - sum(r.num_rows for r in prefilling))
            if decode_starts is not None and decoding:
                prefill_time, prefill_rows = within_prefill_shape(prefill_time, self.prefill_shape)
        if decode_starts is not None:
            scheduled = dict.fromkeys([r.request_id for r in decoding], 1)
            budget -= self.num_running_rows - sum(r.num_rows for r in prefilling)
            assert budget >= 0, "max_num_batched_tokens >= max_num_seqs leaves every decode row its position"
            rest = prefilling
        else:  # the pool is short: schedule request by request, preempting as needed
            rest = decoding + prefilling
        for request in rest:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            remaining = self._remaining(request)
            limit = budget if remaining <= 1 else min(budget, prefill_time)  # a decode row always runs
            n = min(remaining, limit // request.num_rows)
            if n <= 0 or (remaining > 1 and request.num_rows > prefill_rows):
                continue
            while request.status is RequestStatus.RUNNING:
                if self.kv.allocate_slots(request, n) is not None:
                    scheduled[request.request_id] = n
                    budget -= n * request.num_rows
                    if remaining > 1:
                        prefill_time -= n * request.num_rows
                        prefill_rows -= request.num_rows
                    break
                budget += preempt(self.running[-1])

        if not preempted:  # a step that ran out of blocks for its running requests admits nothing
            # (a request preempted below for a higher priority is not back before the next step)
            self._admit_waiting(scheduled, budget, prefill_time, prefill_rows,
                                waits=lambda r: r.request_id in preempted, make_room=make_room)

        if decode_starts is not None and not preempted and len(scheduled) == len(decoding):
            out = decode_output(decoding, decode_starts, finished, self.kv.block_tables)  # the steady state
        else:
            out = build_output(self._requests, scheduled, preempted, finished, self.kv.block_tables)
        self._in_flight.append(out)
        return out

    def prefill_time_budget(self, decode_rows: int) -> int:
        """Prefill positions a step with ``decode_rows`` decode rows may take under the
        step-time target (``chorus.engine.step_budget.prefill_time_budget``)."""
        return prefill_time_budget(self.config, self.step_cost, self.step_time_target_s, decode_rows)

    def schedule_ahead(self) -> SchedulerOutput | None:
        """The next step, scheduled while the one in flight has not been committed: its
        tokens are still on the device (a one-step lookahead, see docs/engine.md).

        Only the steady state is scheduled ahead: every running request was in the step in
        flight and samples from it, so each one decodes its next position, and the step is
        exactly the decoding requests, minus those that the step in flight ends by
        ``max_tokens``; with ``config.admit_ahead``, plus the waiting requests that can be
        admitted without preempting (``_admit_ahead``). Returns None, and changes nothing,
        whenever the regular ``schedule`` could decide otherwise: a deadline has passed, a
        waiting request could be admitted (with ``admit_ahead``: a recompute, or one a step ahead
        found the pool short for), the pool is short of blocks for the decode rows
        (preemption), or a request is still prefilling. A request
        that the step in flight ends on EOS (learned at its commit) keeps a wasted row in the
        step ahead; ``update_from_output`` ignores it.
        """
        assert len(self._in_flight) == 1, "schedule_ahead() needs exactly one step in flight"
        prev = self._in_flight[0]
        if len(prev.requests) != len(self.running) or not prev.row_needs_logits.all():
            return None  # a request not in the step, or one still prefilling
        if self._deadlines and self._deadlines[0][0] <= self.clock():
            return None
        # the step in flight appends one token to each request: those reaching max_tokens end
        going = [r for r in self.running if len(r.output_tokens) + 1 < r.max_tokens]
        if not going:
            return None
        rows = sum(r.num_rows for r in going)
        head = self.waiting.peek()
        admissible = head is not None and rows + head.num_rows <= self.config.max_num_seqs
        # the regular schedule would admit the head; with admit_ahead, unless it is a preempted
        # request's recompute (its generated tokens are fed from the host, not from the step in
        # flight) or a step ahead found the pool short for it (the regular one may preempt)
        if admissible and (not self.config.admit_ahead or head.output_tokens or self._needs_regular_schedule):
            return None
        n_prev = prev.num_scheduled_tokens
        starts = np.fromiter((r.num_computed_tokens + n_prev[r.request_id] for r in going), np.int64, len(going))
        if not self._allocate_next_blocks(going, starts):
            return None
        admitted = self._admit_ahead(rows) if admissible else {}
        if admitted:
            out = build_output(self._requests, {**dict.fromkeys([r.request_id for r in going], 1), **admitted}, [], [],
                               self.kv.block_tables, in_flight=n_prev)
        else:
            out = decode_output(going, starts, [], self.kv.block_tables)
        self._in_flight.append(out)
        return out

    def _admit_ahead(self, decode_rows: int) -> dict[str, int]:
        """Admit waiting requests into a step scheduled ahead beside ``decode_rows`` decode
        rows, as the regular schedule would but without preempting: in priority order, while
        rows, the token budget, the prefill time and free blocks allow, up to the first
        recompute (left to the regular schedule). Returns the positions each admitted request
        computes. When the pool is short for a request, the next step is scheduled the regular
        way, which may preempt for it."""
        def defer(request: Request) -> None:
            self._needs_regular_schedule = True

        admitted: dict[str, int] = {}
        prefill_time, prefill_rows = within_prefill_shape(self.prefill_time_budget(decode_rows), self.prefill_shape)
        self._admit_waiting(admitted, self.config.max_num_batched_tokens - decode_rows, prefill_time, prefill_rows,
                            waits=lambda r: bool(r.output_tokens), make_room=defer)
        return admitted

    def _admit_waiting(self, scheduled: dict[str, int], budget: int, prefill_time: int, prefill_rows: float, *,
                       waits: Callable[[Request], bool], make_room: Callable[[Request], int | None]) -> None:
        """Admit waiting requests in priority order into ``scheduled`` (request id -> positions)
        while rows, the token ``budget``, the ``prefill_time`` positions and the ``prefill_rows``
        prompt rows allow (every admitted request counts against the last, whether or not it
        has prompt positions left). Stops at the first request that ``waits`` or that does not
        fit; one the pool is short for gets ``make_room(request)``: the budget that freeing
        blocks gave back (then it is tried again), or None (admission stops)."""
        while self.waiting:
            request = self.waiting.peek()
            if waits(request) or self.num_running_rows + request.num_rows > self.config.max_num_seqs:
                break
            if request.num_rows > prefill_rows:
                break
            computed = self.kv.get_computed_blocks(request)
            remaining = request.num_tokens - computed.num_tokens
            limit = budget if remaining <= 1 else min(budget, prefill_time)
            n = min(remaining, limit // request.num_rows)
            if n <= 0 or (n < remaining and not self.config.enable_chunked_prefill):
                break
            if self.kv.allocate_slots(request, n, computed) is None:
                freed = make_room(request)
                if freed is None:
                    break
                budget += freed
                continue
            self.waiting.pop()
            request.set_status(RequestStatus.RUNNING)
            self._add_running(request)
            scheduled[request.request_id] = n
            budget -= n * request.num_rows
            prefill_rows -= request.num_rows
            if remaining > 1:
                prefill_time -= n * request.num_rows

    def update_from_output(self, output: SchedulerOutput, sampled: Mapping[str, int]) -> list[RequestOutput]:
        """Commit the step: advance computed positions, register newly full blocks in the prefix
        cache, append each sampled token (``sampled[request_id]`` for every request whose
        logits were needed), stop on EOS / ``max_tokens`` and free finished requests."""
        assert self._in_flight and output is self._in_flight[0], \
            "update_from_output() must get the oldest step scheduled and not yet committed"
        self._in_flight.pop(0)
        running = RequestStatus.RUNNING
        live = [r for r in output.requests.values() if r.status is running]  # others aborted in flight
        for request in live:
            n = output.num_scheduled_tokens[request.request_id]
            for seq in request.sequences:
                seq.num_computed_tokens += n
        self._cache_full_blocks(output)
        results, prefilling = [], self._prefilling
        for request in live:
            request_id = request.request_id
            if request in prefilling:  # (a decoding request has computed its last position)
                if self._remaining(request) <= 1:
                    prefilling.discard(request)  # it decodes from now on
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
    def _remaining(self, request: Request) -> int:
        return request.num_tokens - request.num_computed_tokens

    def _cache_full_blocks(self, output: SchedulerOutput) -> None:
        """Register in the prefix cache the blocks that this step filled (rows whose span
        crossed a block end), before any request of the step is finished and freed."""
        bs = self.kv.block_size
        starts = output.row_starts
        ends = starts + output.row_num_tokens
        for i in np.flatnonzero(ends // bs > starts // bs).tolist():
            seq = output.seqs[i]
            if output.requests[seq.request_id].status is RequestStatus.RUNNING:
                self.kv.cache_computed_blocks(seq)

    def _allocate_decode_slots(self, decoding: list[Request]) -> np.ndarray | None:
        """Give every decoding request its next position, all or nothing; returns their
        computed positions, or None (and nothing allocated) when the pool is short. A row's
        table covers exactly its computed positions between steps (``check_invariants``), so it
        needs a block iff its next position starts one; those are taken in scheduling order,
        as request by request would."""
        computed = np.fromiter((r.sequences[0].num_computed_tokens for r in decoding), np.int64, len(decoding))
        return computed if self._allocate_next_blocks(decoding, computed) else None

    def _allocate_next_blocks(self, requests: list[Request], positions: np.ndarray) -> bool:
        """A block for every row of ``requests`` whose next position (``positions``, per
        request) starts one; all or nothing."""
        at_boundary = np.flatnonzero(positions % self.kv.block_size == 0).tolist()
        seqs = [seq for i in at_boundary for seq in requests[i].sequences]
        return self.kv.allocate_next_blocks(seqs, [int(positions[i]) for i in at_boundary for _ in requests[i].sequences])

    def _add_running(self, request: Request) -> None:
        bisect.insort(self.running, request, key=Request.sort_key)
        self.num_running_rows += request.num_rows
        if self._remaining(request) > 1:
            self._prefilling.add(request)

    def _remove_running(self, request: Request) -> None:
        self.running.remove(request)
        self.num_running_rows -= request.num_rows
        self._prefilling.discard(request)

    def _lower_priority_victim(self, request: Request) -> Request | None:
        """The lowest-priority, newest running request of strictly lower priority, if any."""
        victim = self.running[-1] if self.running else None  # running is in scheduling order
        return victim if victim is not None and victim.priority > request.priority else None

    def _preempt(self, victim: Request) -> None:
        self._remove_running(victim)
        self.kv.free(victim)  # every block of both rows; generated tokens stay on the request
        victim.set_status(RequestStatus.PREEMPTED)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(victim)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        if request.status is RequestStatus.RUNNING:
            self._remove_running(request)
        else:
            self.waiting.remove(request)
        self.kv.free(request)
        request.finish(reason, error)
        del self._requests[request.request_id]

    def _expire_deadlines(self) -> list[RequestOutput]:
        now, heap = self.clock(), self._deadlines
        expired = []
        while heap and heap[0][0] <= now:
            request = heapq.heappop(heap)[2]
            if not request.is_finished:
                expired.append(request)
        expired.sort(key=lambda r: r.arrival_order)  # the order they were added in
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

    def check_invariants(self) -> None:
        """Assert the scheduler's and the cache's consistency (for tests)."""
        self.kv.check_invariants()
        assert self.num_running_rows == sum(r.num_rows for r in self.running) <= self.config.max_num_seqs
        assert self.running == sorted(self.running, key=Request.sort_key)
        assert self._prefilling == {r for r in self.running if self._remaining(r) > 1}
        waiting = list(self.waiting)
        assert {r.request_id for r in self.running} | {r.request_id for r in waiting} == set(self._requests)
        assert len(self.running) + len(waiting) == len(self._requests)
        in_flight: dict[str, int] = {}  # positions scheduled but not committed, per request
        for out in self._in_flight:
            for rid, n in out.num_scheduled_tokens.items():
                in_flight[rid] = in_flight.get(rid, 0) + n
        for request in self.running:
            assert request.status is RequestStatus.RUNNING, request
            assert len({s.num_computed_tokens for s in request.sequences}) == 1, request
            for seq in request.sequences:
                self.kv.check_sequence(seq)
                # what _allocate_decode_slots relies on
                covered = seq.num_computed_tokens + in_flight.get(request.request_id, 0)
                assert len(self.kv.block_table(seq.seq_id)) == cdiv(covered, self.kv.block_size), seq
        for request in waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), request
            assert request.num_computed_tokens == 0, request
            assert all(not self.kv.block_table(s.seq_id) for s in request.sequences), request
