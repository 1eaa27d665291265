"""The T3 engine on its own thread, with an asyncio token stream per request.

The HTTP event loop never runs model code: requests go to the engine thread through a
command queue, and each request's tokens come back through its own ``asyncio.Queue``. A
consumer that stops iterating (a client disconnect) aborts its request, which frees every KV
block it held at once.

A layer that consumes tokens on threads rather than in asyncio (the speech pipeline) passes
``on_step`` instead: it is called on the engine thread with every step's outputs, and requests
go in with :meth:`AsyncT3Engine.submit`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
from dataclasses import dataclass
import time
from typing import AsyncIterator, Callable, Sequence

import torch

from chorus.engine.engine import T3Engine, T3Request, T3Result
from chorus.engine.request import FinishReason
from chorus.engine.scheduler import RequestOutput, SchedulerStats

StepListener = Callable[[list[RequestOutput]], None]

_ids = itertools.count()


class RequestFailed(RuntimeError):
    """A request ended with an error (rejected at admission, failed step, deadline)."""

    def __init__(self, request_id: str, reason: FinishReason, message: str):
        super().__init__(f"request {request_id} {reason.value}: {message}")
        self.request_id, self.reason = request_id, reason


@dataclass(frozen=True)
class TokenEvent:
    token: int | None
    finish_reason: FinishReason | None = None
    error: str | None = None
    exception: BaseException | None = None  # raised in the consumer (e.g. an admission error)
    alignment: torch.Tensor | None = None  # the token's alignment row (``T3Request.want_alignment``)


class AsyncT3Engine:
    """Owns a ``T3Engine`` and the thread that steps it."""

    def __init__(self, engine: T3Engine, *, idle_wait_s: float = 0.05, on_step: StepListener | None = None,
                 intra_op_threads: int | None = None,
                 on_step_time: Callable[[float, bool], None] | None = None):
        """``intra_op_threads``: torch's intra-op threads for the engine thread's own ops (set
        when the thread starts; None: leave torch's setting). ``on_step_time``: called on the
        engine thread with each step's wall seconds and whether it computed prompt positions
        (``T3Engine.last_step_prefilled``)."""
        if intra_op_threads is not None and intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be >= 1 or None, got {intra_op_threads!r}")
        self.engine = engine
        self.on_step = on_step
        self.intra_op_threads = intra_op_threads
        self.on_step_time = on_step_time
        self.busy_s = 0.0  # time spent inside engine steps (for timing breakdowns)
        self.steps = 0  # engine steps taken (busy_s / steps: the mean step's wall time)
        self._commands: queue.Queue = queue.Queue()
        self._consumers: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._idle_wait_s = idle_wait_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.tokens_generated = 0  # speech tokens sampled so far (a counter for tokens/s)
        self.step_started_at: float | None = None  # monotonic start of the step running now

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "AsyncT3Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chorus-t3-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stopping.set()
        self._commands.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- consumer side (any asyncio loop) --------------------------------------------------------
    async def stream(self, request: T3Request) -> AsyncIterator[int]:
        """Yield the request's speech tokens as they are sampled. Raises ``RequestFailed`` (or the
        admission error) if it ends in error; leaving the iteration early aborts the request."""
        async for token, _ in self.stream_aligned(request):
            yield token

    async def stream_aligned(self, request: T3Request) -> AsyncIterator[tuple[int, torch.Tensor | None]]:
        """:meth:`stream` yielding ``(token, alignment row)``; the row is None unless the
        request has ``want_alignment``."""
        if not self.is_running:
            raise RuntimeError("the engine thread is not running; call start() first")
        request_id = request.request_id or f"stream-{next(_ids)}"
        request.request_id = request_id
        events: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._consumers:
                raise ValueError(f"request id {request_id!r} is already streaming")
            self._consumers[request_id] = (asyncio.get_running_loop(), events)
        self._commands.put(("add", request))
        finished = False
        try:
            while True:
                event: TokenEvent = await events.get()
                if event.exception is not None:
                    finished = True
                    raise event.exception
                if event.token is not None:
                    yield event.token, event.alignment
                if event.finish_reason is not None:
                    finished = True
                    if event.finish_reason in (FinishReason.ERROR, FinishReason.DEADLINE):
                        raise RequestFailed(request_id, event.finish_reason, event.error or "")
                    return
        finally:
            with self._lock:
                self._consumers.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", request_id))

    async def generate(self, request: T3Request) -> T3Result:
        """Run one request to completion and return all its tokens (and its alignment map when
        it has ``want_alignment``)."""
        result = T3Result(request.request_id or "")
        rows = []
        async for token, row in self.stream_aligned(request):
            result.tokens.append(token)
            rows.append(row)
        result.request_id = request.request_id or ""
        if request.want_alignment and rows:
            result.alignment = torch.stack(rows)
        return result

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def request_stats(self) -> "concurrent.futures.Future[SchedulerStats]":
        """The engine's ``stats()`` taken on the engine thread between two steps (the scheduler
        and the block pool are only ever read by their owner). The future resolves within one
        step; a stalled engine never resolves it, so wait with a timeout."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("stats", future))
        return future

    def submit(self, requests: Sequence[T3Request]) -> None:
        """Queue requests (each with its ``request_id`` set) for the engine thread; they are
        admitted together, before the next step. Their outputs, admission failures included
        (as an ``ERROR`` output), go to ``on_step``. Thread-safe."""
        if self.on_step is None:
            raise RuntimeError("submit() needs an engine built with on_step; use stream() otherwise")
        if any(r.request_id is None for r in requests):
            raise ValueError("submitted requests need a request_id")
        self._commands.put(("add_many", list(requests)))

    # -- engine thread ---------------------------------------------------------------------------
    def _deliver(self, request_id: str, event: TokenEvent) -> None:
        with self._lock:
            consumer = self._consumers.get(request_id)
        if consumer is not None:
            loop, events = consumer
            loop.call_soon_threadsafe(events.put_nowait, event)

    def _apply(self, commands: list[tuple[str, object]]) -> None:
        """Apply commands in their order; a run of consecutive admissions ("add", "add_many")
        is admitted as one burst (``T3Engine.add_requests``: their prompt embeddings in one
        batch)."""
        burst: list[tuple[T3Request, bool]] = []  # (request, its consumer waits on a stream())
        for command, payload in commands:
            if command == "add_many":
                burst.extend((request, False) for request in payload)
                continue
            if command == "add":
                burst.append((payload, True))
                continue
            self._admit(burst)
            burst = []
            if command == "abort":
                out = self.engine.abort(payload)
                if out is not None:
                    self._deliver(payload, TokenEvent(None, FinishReason.ABORTED))
            elif command == "stats":
                if payload.set_running_or_notify_cancel():
                    payload.set_result(self.engine.stats())
        self._admit(burst)

    def _admit(self, burst: list[tuple[T3Request, bool]]) -> None:
        """Admit a burst; a refused request's failure goes where its caller looks: the exception
        itself to a ``stream()`` consumer, an ``ERROR`` output to ``on_step`` for ``submit()``."""
        if not burst:
            return
        failed = []
        for (request, streamed), outcome in zip(burst, self.engine.add_requests([r for r, _ in burst])):
            if not isinstance(outcome, Exception):
                continue
            if streamed:
                self._deliver(request.request_id, TokenEvent(None, FinishReason.ERROR, str(outcome), outcome))
            else:
                failed.append(RequestOutput(request.request_id, None, FinishReason.ERROR, str(outcome)))
        if failed:
            self.on_step(failed)

    def _run(self) -> None:
        if self.intra_op_threads is not None:
            import torch

            torch.set_num_threads(self.intra_op_threads)  # this thread's parallel ops (OpenMP: per thread)
        try:
            while not self._stopping.is_set():
                busy = self.engine.has_unfinished_requests()
                commands = []
                try:
                    if busy:
                        commands.append(self._commands.get_nowait())
                    else:  # idle: sleep until a command arrives
                        commands.append(self._commands.get(timeout=self._idle_wait_s))
                    while True:  # drain what else arrived
                        commands.append(self._commands.get_nowait())
                except queue.Empty:
                    pass
                self._apply(commands)
                if self.engine.has_unfinished_requests():
                    start = time.perf_counter()
                    self.step_started_at = time.monotonic()
                    events = self.engine.step()
                    self.step_started_at = None
                    elapsed = time.perf_counter() - start
                    self.busy_s += elapsed
                    self.steps += 1
                    if self.on_step_time is not None:
                        self.on_step_time(elapsed, self.engine.last_step_prefilled)
                    self.tokens_generated += sum(1 for event in events if event.new_token is not None)
                    for event in events:
                        self._deliver(event.request_id, TokenEvent(event.new_token, event.finish_reason, event.error,
                                                                      alignment=event.alignment))
                    if self.on_step is not None and events:
                        self.on_step(events)
        except BaseException as exc:  # noqa: BLE001 - fail every consumer instead of hanging them
            with self._lock:
                pending = list(self._consumers)
            for request_id in pending:
                self._deliver(request_id, TokenEvent(None, FinishReason.ERROR, f"engine stopped: {exc}"))
            if self.on_step is not None:
                self.on_step([RequestOutput(rid, None, FinishReason.ERROR, f"engine stopped: {exc}")
                              for rid in self.engine.scheduler.unfinished_request_ids()])
            raise
