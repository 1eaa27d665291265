"""The speech pipeline: text -> chunks -> T3 engine -> vocoder stage -> audio, for many requests.

Threads: the caller's thread plans a request (validation, chunking, voice, conditioning) and
submits its chunks; the **T3 thread** (``AsyncT3Engine``) runs continuous batching and hands
each step's tokens over; the **vocoder thread** owns every request's state, feeds tokens to the
batched ``VocoderStage``, orders the audio of each request's chunks and delivers it to the
request's :class:`SpeechStream`. On CUDA the vocoder thread runs on its own stream, so S3Gen and
T3 work overlap on the GPU (``stats()`` shows the busy time of each and the wall time).

All chunks of a request are submitted to T3 at once and generated in parallel; audio leaves in
chunk order. Chunk ``i`` uses seed ``seed + i`` for T3 and S3Gen, as on the exact path, so a
non-streaming request gets the exact path's audio for the same tokens and noise.

Voice conversions (:meth:`Pipeline.convert`) skip T3: the caller's thread tokenizes the source
clip and the vocoder thread hands the tokens to the same stage as one job, batched with the
text-to-speech jobs (``chorus.conversion``, docs/voice-conversion.md).

What the vocoder thread keeps per request (its chunks' jobs, deadlines, timings, in-order
delivery) is ``chorus.pipeline.request_state``; the settings are ``chorus.pipeline.config``.
"""
from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from chorus.engine.async_engine import AsyncT3Engine
from chorus.engine.config import EngineConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.request import FinishReason
from chorus.engine.scheduler import RequestOutput
from chorus.conversion.planner import ConversionPlan, ConversionPlanner
from chorus.conversion.request import ConversionRequest
from chorus.conversion.runner import add_to_stage, conversion_result
from chorus.models.loading import Checkpoint
from chorus.models.s3gen.s3gen import SAMPLE_RATE, TokenRules
from chorus.models.variants import Variant
from chorus.pipeline.conditioning import ConditioningCache
from chorus.pipeline.config import PipelineConfig
from chorus.pipeline.models import SpeechModels
from chorus.pipeline.planner import SpeechPlan
from chorus.pipeline.request import ChunkResult, SpeechRequest, SpeechResult
from chorus.pipeline.request_state import ChunkJob, Deadlines, Progress, RequestState
from chorus.pipeline.stitch import pause_spans, stitch_chunks
from chorus.pipeline.errors import PipelineError
from chorus.pipeline.stream import AudioPiece, SpeechStream
from chorus.pipeline.threads import on_stream, thread_shares
from chorus.vocoder import AudioOut, VocoderStage, VocoderStats

# A vocoder pass is stuck, not just busy, only past this many times its predicted time (its
# stage's cost model follows the device and the load on it) or the caller's timeout if longer:
# under load a CPU pass of many streams takes seconds, which is not a reason to be unready.
PASS_STALL_FACTOR = 3.0

# About what a trained model speaks per input character (English, as `chorus bench` assumes):
# sizes the whole chunks whose vocoder shapes `warmup` captures.
SPEECH_TOKENS_PER_CHAR = 1.6

logger = logging.getLogger(__name__)


@dataclass
class PipelineStats:
    t3_busy_s: float
    t3_steps: int
    vocoder_busy_s: float
    vocoder: VocoderStats  # a copy of the stage's own counters
    requests_done: int
    audio_seconds: float


class Pipeline:
    """Text to audio for many concurrent requests over one T3 engine and one vocoder stage.

    Use as a context manager (or call :meth:`close`)::

        with Pipeline.load("turbo", "ckpt/turbo", device="cuda") as pipe:
            result = pipe.submit(SpeechRequest("Hello there.", seed=7)).result()
            results = pipe.generate([SpeechRequest(t) for t in texts])
    """

    def __init__(self, models: SpeechModels, config: PipelineConfig | None = None):
        self.models = models
        self.config = config = config or PipelineConfig()
        variant = models.variant
        # the pipeline's deadline covers the whole request; T3 only gets what a request brings
        engine_config = replace(config.engine or EngineConfig(variant=variant.name), default_deadline_s=None)
        self.planner = models.planner(config.max_chars, alignment=engine_config.alignment)
        self._conversion_planner: ConversionPlanner | None = None
        self.conditioning = ConditioningCache(models.t3, variant, config.conditioning_cache_size)
        self._token_rules = TokenRules.for_variant(variant)
        self._cuda_stream = torch.cuda.Stream(models.device) if models.device.type == "cuda" else None
        self.vocoder = VocoderStage(models.s3gen, config.vocoder)
        if config.warmup:  # before the engine sizes its KV pool from what is left (PipelineConfig.warmup)
            self.warmup()
        self.engine = T3Engine(models.t3, variant, engine_config, cuda_graphs=config.cuda_graphs)
        self._threads_at_start = torch.get_num_threads()
        self._t3_threads, self._vocoder_threads = thread_shares(models.device, config.split_cpu_threads)
        self._t3 = AsyncT3Engine(self.engine, on_step=self._on_t3_step, intra_op_threads=self._t3_threads,
                                 on_step_time=self._on_t3_step_time)
        self._timing_listener: Callable[[str, float], None] | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._requests: dict[str, RequestState] = {}  # owned by the vocoder thread
        self._jobs: dict[str, ChunkJob] = {}  # owned by the vocoder thread
        self._active_ids: set[str] = set()  # ids submitted and not yet ended (any thread)
        self._active_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.vocoder_busy_s = 0.0
        self._vocoder_step_started_at: float | None = None
        self.requests_done = 0
        self.audio_seconds = 0.0

    @classmethod
    def load(cls, variant: Variant | str, checkpoint: Checkpoint | str | os.PathLike | None = None, *,
             dtype: str | torch.dtype = "auto", device: str | torch.device | None = "cpu",
             voice_models: bool = True, config: PipelineConfig | None = None) -> "Pipeline":
        """Load the models (see :meth:`SpeechModels.load`) and start the pipeline's threads."""
        models = SpeechModels.load(variant, checkpoint, dtype=dtype, device=device, voice_models=voice_models)
        return cls(models, config).start()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "Pipeline":
        if self._thread is None:
            self._t3.start()
            self._thread = threading.Thread(target=self._run, name="chorus-vocoder", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop both threads; requests still running fail with reason ``"stopped"``."""
        self._stopping.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._t3.stop(timeout)
        if self._t3_threads is not None:  # a stage thread's setting can leak to the process's
            torch.set_num_threads(self._threads_at_start)

    def __enter__(self) -> "Pipeline":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._t3.is_running

    def warmup(self, time_budget_s: float = 120.0) -> int:
        """Compile HiFT's decoder (where ``VocoderConfig.compile_hift`` is on) and capture
        the vocoder's CUDA graphs for common shapes before serving (the T3 engine captures its
        own at construction): streaming windows, and whole chunks of up to ``max_chars`` characters
        at ``SPEECH_TOKENS_PER_CHAR``. Returns the graphs captured (those held already are not
        captured again); 0 on the CPU. ``PipelineConfig.warmup`` runs it during construction,
        before the T3 engine sizes its KV pool."""
        whole = math.ceil(self.config.max_chars * SPEECH_TOKENS_PER_CHAR)
        with on_stream(self._cuda_stream):
            return self.vocoder.warmup(whole_chunk_tokens=whole, time_budget_s=time_budget_s)

    def stall(self, timeout_s: float) -> str | None:
        """Why the pipeline cannot serve, or None: a thread has died, a T3 step has been running
        for more than ``timeout_s`` seconds, or a vocoder pass for more than ``timeout_s`` and
        ``PASS_STALL_FACTOR`` times its predicted time (readiness checks use this)."""
        if not self.is_running:
            return "the pipeline is not running"
        now = time.monotonic()
        since = self._t3.step_started_at
        if since is not None and now - since > timeout_s:
            return f"a T3 step has been running for {now - since:.1f} s"
        since, expected = self._vocoder_step_started_at, self.vocoder.expected_pass_seconds
        if since is not None and now - since > max(timeout_s, PASS_STALL_FACTOR * expected):
            return f"a vocoder pass has been running for {now - since:.1f} s (predicted: {expected:.1f} s)"
        return None

    @property
    def working(self) -> bool:
        """A T3 step or a vocoder pass is under way now (``stall`` says whether for too long)."""
        return self._t3.step_started_at is not None or self._vocoder_step_started_at is not None

    @property
    def active_requests(self) -> int:
        """Requests submitted and not yet ended (any thread)."""
        with self._active_lock:
            return len(self._active_ids)

    @property
    def t3_tokens(self) -> int:
        """Speech tokens T3 has sampled since the start."""
        return self._t3.tokens_generated

    def engine_stats(self, timeout: float | None = 1.0):
        """The T3 engine's ``SchedulerStats`` (queue, rows, preemptions, KV pool), taken on its
        thread between steps; raises ``TimeoutError`` when the engine does not answer in time."""
        import concurrent.futures

        try:
            return self._t3.request_stats().result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the T3 engine did not answer within {timeout} s") from None

    # -- requests --------------------------------------------------------------------------------
    def plan(self, request: SpeechRequest) -> SpeechPlan:
        """Validate and plan a request without running it (raises on bad input)."""
        return self.planner.plan(request)

    def submit(self, request: SpeechRequest | SpeechPlan, *,
               progress: Callable[[Progress], None] | None = None) -> SpeechStream:
        """Plan ``request`` (bad input raises here, before any work) and start it. Thread-safe."""
        if not self.is_running:
            raise RuntimeError("the pipeline is not running; call start() (or use it as a context manager)")
        plan = request if isinstance(request, SpeechPlan) else self.planner.plan(request)
        conditioning = self.conditioning.get(plan.voice, plan.exaggeration)
        state = self._register(plan, progress)
        state.jobs = [ChunkJob(state, c.index) for c in plan.chunks]
        state.pauses_s = plan.pauses_s
        if plan.timestamps is not None:
            state.token_rules = self._token_rules
        self._inbox.put(("add", state))  # before T3 can report on its chunks
        aligned = plan.wants_alignment
        self._t3.submit([T3Request(c.text_ids, conditioning, c.params, priority=plan.priority,
                                   deadline_s=state.deadlines.total_s, request_id=state.job_id(c.index),
                                   want_alignment=aligned)
                         for c in plan.chunks])
        return state.stream

    @property
    def conversion_planner(self) -> ConversionPlanner:
        """Plans voice conversions (made on first use; needs the voice models' S3 tokenizer)."""
        if self._conversion_planner is None:
            self._conversion_planner = self.models.conversion_planner(self.config.conversion)
        return self._conversion_planner

    def convert(self, request: ConversionRequest | ConversionPlan, *,
                progress: Callable[[Progress], None] | None = None) -> SpeechStream:
        """Voice conversion: plan ``request`` on this thread (the source is decoded, checked
        against ``PipelineConfig.conversion`` and tokenized; the target resolved; bad input
        raises here, before any work) and start it. Its tokens are one job of the vocoder stage,
        batched with text-to-speech jobs; the stream and the result are those of a one-chunk
        speech request (streamed in pieces when ``request.stream``). Thread-safe."""
        if not self.is_running:
            raise RuntimeError("the pipeline is not running; call start() (or use it as a context manager)")
        plan = request if isinstance(request, ConversionPlan) else self.conversion_planner.plan(request)
        state = self._register(plan, progress)
        job = ChunkJob(state, 0, tokens=list(plan.tokens), pushed=len(plan.tokens), t3_reason="source")
        state.jobs = [job]
        self._inbox.put(("convert", state))
        return state.stream

    def _register(self, plan: SpeechPlan | ConversionPlan,
                  progress: Callable[[Progress], None] | None) -> RequestState:
        """A new request's state and stream (its id marked active; a duplicate raises)."""
        with self._active_lock:
            if plan.request_id in self._active_ids:
                raise ValueError(f"request id {plan.request_id!r} is already running")
            self._active_ids.add(plan.request_id)
        now = time.monotonic()
        stream = SpeechStream(plan, self.abort, now)
        deadline_s = plan.deadline_s if plan.deadline_s is not None else self.config.default_deadline_s
        start_s = plan.start_deadline_s if plan.start_deadline_s is not None else self.config.default_start_deadline_s
        return RequestState(plan, stream, [], Deadlines(now, start_s, deadline_s), progress)

    def synthesize(self, request: SpeechRequest | str, **options: Any) -> SpeechResult:
        """Speak one text and wait for the whole result."""
        if isinstance(request, str):
            request = SpeechRequest(request, **options)
        return self.submit(request).result()

    def generate(self, requests: Sequence[SpeechRequest | str], *,
                 progress: Callable[[Progress], None] | None = None) -> list[SpeechResult]:
        """Run many requests at once (all their chunks batch together); results in input order.
        Every request is planned before any starts, so bad input fails the whole call early."""
        plans = [self.planner.plan(SpeechRequest(r) if isinstance(r, str) else r) for r in requests]
        streams = [self.submit(p, progress=progress) for p in plans]
        return [s.result() for s in streams]

    def abort(self, request_id: str) -> None:
        """Cancel a request: its T3 chunks and vocoder jobs are dropped at once; its stream
        raises ``PipelineError(reason="aborted")``. Unknown ids are ignored. Thread-safe."""
        self._inbox.put(("abort", request_id))

    def stats(self) -> PipelineStats:
        """A snapshot of the counters (later work does not change it; subtract two to time a span)."""
        return PipelineStats(t3_busy_s=self._t3.busy_s, t3_steps=self._t3.steps, vocoder_busy_s=self.vocoder_busy_s,
                             vocoder=replace(self.vocoder.stats), requests_done=self.requests_done,
                             audio_seconds=self.audio_seconds)

    # -- T3 thread -------------------------------------------------------------------------------
    def _on_t3_step_time(self, seconds: float, prefilled: bool) -> None:
        self._timing("t3", seconds)
        if prefilled:
            self._timing("t3_prefill", seconds)

    def _on_t3_step(self, events: list[RequestOutput]) -> None:
        self._inbox.put(("t3", (time.monotonic(), events)))  # when T3 made them, not when they are read

    # -- vocoder thread --------------------------------------------------------------------------
    def set_timing_listener(self, listener: Callable[[str, float], None] | None) -> None:
        """``listener(stage, seconds)`` is called, on the pipeline's threads, with ``"queue"``
        (a request's submission to its first T3 token), ``"t3"`` (each T3 step), ``"t3_prefill"``
        (each T3 step, among those, that computed prompt positions: an admission or a prompt
        chunk, from a mixed CUDA graph where one holds it, else eagerly) and ``"vocoder"`` (each vocoder pass). It
        must be quick and thread-safe (e.g. a Prometheus histogram's ``observe``)."""
        self._timing_listener = listener

    def _timing(self, stage: str, seconds: float) -> None:
        listener = self._timing_listener
        if listener is not None:
            try:
                listener(stage, seconds)
            except Exception:  # noqa: BLE001 - metrics must never take a stage down
                logger.exception("the timing listener failed")

    def _run(self) -> None:
        if self._vocoder_threads is not None:
            torch.set_num_threads(self._vocoder_threads)  # this thread's parallel ops (OpenMP: per thread)
        try:
            while not self._stopping.is_set():
                self._drain(block=not self.vocoder.has_work())
                self._expire_deadlines()
                if self.vocoder.has_work():
                    start = time.perf_counter()
                    self._vocoder_step_started_at = pass_started = time.monotonic()
                    with on_stream(self._cuda_stream):
                        outs = self.vocoder.step()
                    self._vocoder_step_started_at = None
                    elapsed = time.perf_counter() - start
                    self.vocoder_busy_s += elapsed
                    self._timing("vocoder", elapsed)
                    for out in outs:
                        self._on_audio(out, pass_started)
                elif self._inbox.empty():
                    with on_stream(self._cuda_stream):
                        self.vocoder.capture_while_idle()
        except BaseException as exc:  # noqa: BLE001 - fail every request instead of hanging them
            logger.exception("the vocoder thread stopped")
            for state in list(self._requests.values()):
                self._fail(state, "error", f"pipeline stopped: {exc}")
            raise
        for state in list(self._requests.values()):
            self._fail(state, "stopped", "the pipeline was closed")

    def _drain(self, block: bool) -> None:
        touched: set[str] = set()
        try:
            message = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
            while True:
                self._apply(*message, touched)
                message = self._inbox.get_nowait()
        except queue.Empty:
            pass
        with on_stream(self._cuda_stream):
            for job_id in touched:
                job = self._jobs.get(job_id)
                if job is not None:
                    self._push(job_id, job)

    def _apply(self, kind: str, payload, touched: set[str]) -> None:
        if kind == "add":
            state: RequestState = payload
            plan = state.plan
            self._requests[plan.request_id] = state
            # a stream's chunks, and streams sharing a listener, are heard one after another
            listener = plan.listener or (plan.request_id if plan.stream and len(plan.chunks) > 1 else None)
            with on_stream(self._cuda_stream):
                for job in state.jobs:
                    chunk = plan.chunks[job.index]
                    self.vocoder.add(state.job_id(job.index), plan.voice, seed=chunk.seed, streaming=plan.stream,
                                     n_steps=plan.flow_steps, priority=int(plan.priority), listener=listener)
                    self._jobs[state.job_id(job.index)] = job
        elif kind == "convert":
            state = payload
            self._requests[state.plan.request_id] = state
            job_id = state.job_id(0)
            with on_stream(self._cuda_stream):
                add_to_stage(self.vocoder, state.plan, job_id)
            self._jobs[job_id] = state.jobs[0]
        elif kind == "t3":
            stepped_at, events = payload
            for event in events:
                self._on_t3_event(event, stepped_at, touched)
        elif kind == "abort":
            state = self._requests.get(payload)
            if state is not None:
                self._fail(state, "aborted", "cancelled")

    def _on_t3_event(self, event: RequestOutput, stepped_at: float, touched: set[str]) -> None:
        """``stepped_at``: the ``time.monotonic()`` at which T3's step produced ``event``."""
        job = self._jobs.get(event.request_id)
        if job is None:
            return  # a job of a request that already ended
        if event.new_token is not None:
            job.tokens.append(event.new_token)
            if event.alignment is not None:
                job.rows.append(event.alignment)
            touched.add(event.request_id)
            if job.index == 0 and job.request.first_token is None:
                job.request.first_token = stepped_at
                self._timing("queue", job.request.first_token - job.request.submitted)
            if job.index == 0 and job.request.plan.stream and job.request.first_window is None:
                job.stamps.append(stepped_at)
        reason = event.finish_reason
        if reason is None:
            return
        if reason in (FinishReason.EOS, FinishReason.LENGTH):
            job.t3_reason = reason.value
            touched.add(event.request_id)
        elif reason is FinishReason.DEADLINE:  # T3 has the total deadline only
            _, why = job.request.deadlines.expired(float("inf"), True) or ("total", f"T3 deadline in chunk {job.index}")
            self._fail(job.request, "deadline", why, deadline="total")
        elif reason is not FinishReason.ABORTED:  # ERROR
            self._fail(job.request, "error", event.error or f"T3 {reason.value} in chunk {job.index}")

    def _push(self, job_id: str, job: ChunkJob) -> None:
        final = job.t3_reason is not None
        if job.request.plan.stream or final:
            if job.stamps:
                job.push_to_first_window(self.vocoder, job_id, final)
            new = job.tokens[job.pushed:]
            if new or final:
                self.vocoder.push(job_id, new, final=final)
                job.pushed = len(job.tokens)

    def _on_audio(self, out: AudioOut, pass_started: float) -> None:
        """``pass_started``: the ``time.monotonic()`` at which the pass that made ``out`` began."""
        job = self._jobs.get(out.job_id)
        if job is None:
            return
        state = job.request
        if out.error is not None:
            self._fail(state, "error", f"vocoder failed on chunk {job.index}: {out.error}")
            return
        samples = out.samples.numpy() if isinstance(out.samples, torch.Tensor) else np.asarray(out.samples)
        if samples.size and state.first_audio is None:
            state.first_audio, state.first_pass = time.monotonic(), pass_started
        job.pieces.append(samples)
        if out.final:
            job.done = True
            del self._jobs[out.job_id]
            if state.progress is not None:
                state.progress(Progress(state.plan.request_id, job.index, job.waveform().size / SAMPLE_RATE))
        if state.plan.stream:
            state.deliver_in_order()
        if all(j.done for j in state.jobs):
            self._complete(state)

    def _end(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        with self._active_lock:
            self._active_ids.discard(request_id)

    def _complete(self, state: RequestState) -> None:
        plan = state.plan
        self._end(plan.request_id)
        waves = [j.waveform() for j in state.jobs]
        audio = stitch_chunks(waves, state.pauses_s)
        if plan.watermark is not None:
            from chorus.watermark import get_watermarker

            audio = get_watermarker(plan.watermark).apply(audio, SAMPLE_RATE)
        if not plan.stream:
            state.stream._put_audio(AudioPiece(audio, len(state.jobs) - 1, True))
        timings = state.timings(time.monotonic())
        self.requests_done += 1
        self.audio_seconds += audio.size / SAMPLE_RATE
        if isinstance(plan, ConversionPlan):
            state.stream._finish(conversion_result(plan, audio, timings))
            state.release()
            return
        chunks = tuple(ChunkResult(c.text, c.seed, len(j.tokens), j.t3_reason or "eos", w.size,
                                   tuple(j.tokens))
                       for c, j, w in zip(plan.chunks, state.jobs, waves))
        pauses = pause_spans([w.size for w in waves], state.pauses_s)
        timestamps = tuple(state.chunk_timings(i) for i in range(len(waves))) if state.wants_timestamps else ()
        state.stream._finish(SpeechResult(audio, SAMPLE_RATE, plan.seed, chunks, plan.ignored,
                                          plan.request_id, timings, pauses=pauses, timestamps=timestamps))
        state.release()

    def _fail(self, state: RequestState, reason: str, message: str, deadline: str | None = None) -> None:
        request_id = state.plan.request_id
        if request_id not in self._requests:
            return
        self._end(request_id)
        for job in state.jobs:
            job_id = state.job_id(job.index)
            if self._jobs.pop(job_id, None) is not None:
                self.vocoder.abort(job_id)
            if job.t3_reason is None:
                self._t3.abort(job_id)
        state.stream._fail(PipelineError(request_id, reason, message, deadline))
        state.release()

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for state in list(self._requests.values()):
            expired = state.deadlines.expired(now, state.audio_started)
            if expired is not None:
                kind, why = expired
                self._fail(state, "deadline", why, deadline=kind)
