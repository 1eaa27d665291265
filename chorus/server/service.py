"""One model version's service: its life (loading, warm-up, readiness, the monitor, the canary,
draining) and the one call per action that every front door makes (``speech``, ``convert``,
``configure_stream`` and ``open_call`` for a stream's pieces, the voices, ``readiness``,
``metrics_text``). A request's checks, admission and submission live in ``speak.py``; the doors
(``http/``, the WebSocket, gRPC) only translate their protocol and map the ``APIError`` that
these calls raise onto their own status. Nothing here imports a door.

Life: ``start()`` loads the models on a worker thread (``/health`` answers meanwhile, ``/ready``
says "loading"), warms up, runs a canary synthesis, and only then reports ready. A monitor task
refreshes the engine snapshot every ``MONITOR_INTERVAL_S`` (metrics, pressure, degradation) and
re-runs the canary every ``canary_interval_s``.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from typing import Callable

from chorus.engine.request import Priority
from chorus.pipeline.errors import PipelineError
from chorus.pipeline.request import SpeechRequest
from chorus.server import checks, speak
from chorus.server.admission import Admission
from chorus.server.capacity import CapacityModel
from chorus.server.config import ServerConfig
from chorus.server.degradation import DegradationPolicy
from chorus.server.engine_watch import EngineWatch
from chorus.server.errors import APIError
from chorus.server.metrics import EngineSnapshot, ServerMetrics
from chorus.server.model_entries import aliases
from chorus.server.schemas import SpeechBody
from chorus.server.speech import ConversionForm, SpeechCall, SpeechResponse, check_timestamps, respond, streams
from chorus.server.voice_calls import request_voice, voice_call

logger = logging.getLogger("chorus.server")

MONITOR_INTERVAL_S = 0.25
CANARY_TEXT = "Chorus is ready."
CANARY_LANGUAGE = "en"  # the canary's text is English; a multilingual model needs the code
CANARY_TOKENS = 25  # one second of audio: enough to run every stage once


@dataclass(frozen=True)
class Loaded:
    """What the loader returns: the running pipeline and the voice store."""

    pipeline: "object"  # chorus.pipeline.Pipeline (kept untyped: importing it pulls in torch)
    voices: "object"  # chorus.voices.store.VoiceStore


class SpeechService:
    def __init__(self, config: ServerConfig, loader: Callable[[], Loaded], *, clock=time.monotonic):
        """``loader`` runs on a worker thread at start-up and returns the started pipeline and
        the voice store (``chorus serve`` loads the checkpoint; tests pass tiny models)."""
        self.config = config
        self._loader = loader
        self._clock = clock
        self.pipeline = None
        self.voices = None
        self.state = "starting"  # starting -> loading -> warming -> ready | failed; ready -> draining
        self.failure: str | None = None
        self.started_at = time.time()
        self.capacity = CapacityModel(prior_tokens_per_char=config.tokens_per_char)
        self.admission = Admission(config.max_queue, config.memory_pressure, config.retry_after_s,
                                   capacity=self.capacity, policy=config.admission,
                                   max_retry_after_s=config.max_retry_after_s)
        self.start_deadline_s = config.start_deadline_for("cpu")  # set for the loaded device by start()
        self.degradation = DegradationPolicy(config.degradation)
        self.snapshot = EngineSnapshot()
        self.metrics = ServerMetrics(lambda: self.snapshot)
        self.last_canary_ok: float | None = None
        self.last_canary_error: str | None = None
        self.canary_broken = False  # the last canary failed in a model step (not merely late under load)
        self.sampler = None  # DNSMOS's (chorus.quality.sampler.QualitySampler), with [quality] and a sample rate
        self.fingerprint = None  # what the first canary made (chorus.quality.fingerprint.Fingerprint)
        self.canary_mismatch: str | None = None  # why the last canary did not match it
        self._canary_running = False
        self._monitor: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.watch = EngineWatch()  # the pipeline's counters at the last refresh
        self._drain_holds: list[Callable[[], int]] = []  # work drain() waits for besides admission's
        # other names of this model (a registry sets them; alone: the bare variant name)
        self.aliases: list[str] = [name for name, target in aliases(config.entries()).items()
                                   if target == config.model_id]

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load, warm up, run the canary; failures leave the service in state ``failed`` (the
        process stays up so /health and /ready can say why)."""
        self.loop = asyncio.get_running_loop()  # the loop that serves it (threads post canaries here)
        # the GIL's hand-off: a model thread that wants it back from the event loop waits up to this
        sys.setswitchinterval(self.config.switch_interval_ms / 1000)
        try:
            self.state = "loading"
            loaded = await asyncio.to_thread(self._loader)
            self.pipeline, self.voices = loaded.pipeline, loaded.voices
            device_type = self.pipeline.models.device.type
            self.start_deadline_s = self.config.start_deadline_for(device_type)
            self.admission.realtime_headroom = self.config.realtime_headroom_for(device_type)
            self.capacity.first_window_tokens = self.pipeline.vocoder.config.first_window_tokens
            self.capacity.max_rows = self.pipeline.engine.config.scheduler.max_num_seqs
            self._watch_pipeline()
            await self._start_sampler()
            if self.config.warmup:
                self.state = "warming"
                warmup = getattr(self.pipeline, "warmup", None)
                if warmup is not None:
                    await asyncio.to_thread(warmup)
            self.watch.warmed_up(self.pipeline)
            await self.run_canary()
            if self.last_canary_ok is None:
                raise RuntimeError(f"the start-up canary failed: {self.last_canary_error}")
            if self.fingerprint is None:  # silent or NaN from the first run: nothing to compare with
                raise RuntimeError(f"the start-up canary failed its integrity check: {self.canary_mismatch}")
            self.state = "ready"
            logger.info("ready", extra=self._who())
        except Exception as exc:  # noqa: BLE001 - reported by /ready and the log
            self.state, self.failure = "failed", f"{type(exc).__name__}: {exc}"
            logger.exception("start-up failed", extra=self._who())
        self._monitor = asyncio.create_task(self._monitor_loop())

    async def _start_sampler(self) -> None:
        """DNSMOS on ``quality_sample_rate`` of the requests, when ``chorus-tts[quality]`` is
        installed (without it the metrics are absent; docs/quality.md)."""
        from chorus.quality import dnsmos

        if self.config.quality_sample_rate <= 0:
            return
        if not dnsmos.available():
            logger.info("chorus-tts[quality] is not installed: DNSMOS scores are not exported", extra=self._who())
            return
        from chorus.quality.sampler import QualitySampler

        self.sampler = await asyncio.to_thread(QualitySampler, self.config.quality_sample_rate,
                                               self.metrics.add_dnsmos())

    def _who(self) -> dict:
        """The model version this service runs, for its log lines."""
        entry = self.config.entries()[0]
        return {"variant": entry.variant, "model": entry.id, "version": entry.version}

    def _watch_pipeline(self) -> None:
        """Stage times and the GPU's gauges for the metrics (pipelines that offer them)."""
        if hasattr(self.pipeline, "set_timing_listener"):
            self.pipeline.set_timing_listener(self.metrics.observe_stage)
        models = getattr(self.pipeline, "models", None)
        if models is not None:
            self.metrics.watch_device(models.device)

    async def stop(self) -> None:
        if self.sampler is not None:
            await asyncio.to_thread(self.sampler.close)
        if self._monitor is not None:
            self._monitor.cancel()
            try:
                await self._monitor
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        if self.pipeline is not None:
            await asyncio.to_thread(self.pipeline.close)

    async def drain(self, grace_s: float) -> None:
        """Shutting down: stop taking requests (``/ready`` says draining, new requests get 503
        ``shutting_down``), give the streams in flight up to ``grace_s`` to finish, then end the
        rest (their clients see a cut, logged as one line each) and close the pipeline."""
        if self.state == "ready":
            self.state = "draining"
        deadline = self._clock() + grace_s
        in_flight = self.admission.in_flight
        if in_flight:
            logger.info("draining: %d request(s) in flight get up to %g s to finish", in_flight, grace_s)
        while (self.admission.in_flight or self.held()) and self._clock() < deadline:
            await asyncio.sleep(0.05)
        if self.admission.in_flight:
            logger.warning("shutdown grace of %g s is over: ending %d request(s) still in flight", grace_s,
                           self.admission.in_flight)
        if self.pipeline is not None:
            await asyncio.to_thread(self.pipeline.close)  # remaining requests fail with "stopped"

    def hold_drain(self, count: Callable[[], int]) -> None:
        """Make :meth:`drain` also wait (within its grace) while ``count()`` is above zero: work
        the admission queue does not see, e.g. WebSocket turns between two pieces."""
        self._drain_holds.append(count)

    def held(self) -> bool:
        """Whether some work that :meth:`hold_drain` was told of is still open."""
        return any(hold() for hold in self._drain_holds)

    # ------------------------------------------------------------------------------ readiness
    def readiness(self) -> tuple[bool, str | None]:
        """(ready, why not): "send me traffic". False while loading or warming, after a failed
        start, while draining, when the pipeline is stalled (a dead thread, a step running longer
        than ``stall_timeout_s``, or work in the pipeline and no T3 token nor vocoder pass for
        that long), when the last canary failed in a model step, or (``canary_action`` unready) when
it did not match its fingerprint. Load is not a reason: a
        canary that is merely slow or late under load does not count."""
        if self.state != "ready":
            return False, self.failure or f"the server is {self.state}"
        stall = self.pipeline.stall(self.config.stall_timeout_s) or self._no_progress()
        if stall is not None:
            return False, stall
        if self.canary_broken:
            return False, f"the last canary failed: {self.last_canary_error}"
        if self.config.canary_action == "unready" and self.canary_mismatch is not None:
            return False, f"degraded: {self.degraded()[0]}"
        return True, None

    def _no_progress(self) -> str | None:
        return self.watch.no_progress(self.pipeline, self._clock(), self.config.stall_timeout_s)

    def require_serving(self) -> None:
        """Raise 503 unless the model is loaded, the start-up canary passed and the server is
        not shutting down."""
        if self.state == "draining":
            raise APIError(503, "the server is shutting down; retry on another replica", code="shutting_down",
                           headers={"Retry-After": "5"})
        if self.state != "ready":
            reason = self.failure or f"the model is {self.state}"
            raise APIError(503, f"not ready: {reason}", code="not_ready",
                           headers={"Retry-After": str(max(self.config.retry_after_s, 5))})

    async def run_canary(self) -> None:
        """One short synthesis through the whole pipeline, at high priority, checked against the
        fingerprint the first one recorded (``chorus.quality.fingerprint``). A mismatch of tokens
        or audio is confirmed by a second canary at once before it counts (a one-off is logged)."""
        if self._canary_running:
            return
        self._canary_running = True
        try:
            alone = self.admission.in_flight == 0
            result = await self._canary_synthesis()
            if not self._fingerprint_matches(result, confirmed=False):
                self._fingerprint_matches(await self._canary_synthesis(), confirmed=True)
            self.last_canary_ok, self.last_canary_error, self.canary_broken = self._clock(), None, False
            if alone:  # a first measure of the server, before any request
                tokens = sum(c.speech_tokens for c in result.chunks)
                self.capacity.observe_solo_run(tokens, result.timings["total_s"])
                if "first_audio_s" in result.timings:
                    self.capacity.observe_solo_start(result.timings["first_audio_s"])
        except PipelineError as exc:
            self.last_canary_error = f"{type(exc).__name__}: {exc}"
            # late under load or stopped at shutdown: the stall checks judge the pipeline, not this
            self.canary_broken = exc.reason == "error"
            (logger.error if self.canary_broken else logger.warning)("canary failed: %s", self.last_canary_error)
        except Exception as exc:  # noqa: BLE001 - readiness reports it
            self.last_canary_error = f"{type(exc).__name__}: {exc}"
            self.canary_broken = True
            logger.error("canary failed: %s", self.last_canary_error)
        finally:
            self._canary_running = False

    async def _canary_synthesis(self):
        language = CANARY_LANGUAGE if self.pipeline.models.variant.is_multilingual else None
        request = SpeechRequest(CANARY_TEXT, language=language, seed=0, max_new_tokens=CANARY_TOKENS,
                                priority=Priority.HIGH, deadline_s=self.config.canary_timeout_s,
                                request_id=f"canary-{time.time_ns()}")
        stream = await asyncio.to_thread(self.pipeline.submit, request)
        result = await stream.aresult()
        if result.wav.size == 0 and result.chunks[0].speech_tokens > 0:
            raise RuntimeError("the canary produced tokens but no audio")
        return result

    def _fingerprint_matches(self, result, *, confirmed: bool) -> bool:
        """Compare a canary's result with the fingerprint (the first canary that is neither silent
        nor NaN records it) and update ``canary_mismatch``, the metrics and the log. False only
        for a first token or audio mismatch (``confirmed`` False), which the caller confirms."""
        from chorus.quality.fingerprint import Fingerprint, compare

        current = Fingerprint.of([c.tokens for c in result.chunks], result.wav)
        verdict = compare(self.fingerprint or current, current)
        m = self.metrics
        if verdict.snr_db is not None:
            m.canary_snr.set(verdict.snr_db)
        if verdict.reason is None:
            if self.fingerprint is None:
                self.fingerprint = current
                logger.info("canary fingerprint recorded", extra={**self._who(), "fingerprint": current.summary()})
            elif self.canary_mismatch is not None:
                logger.info("the canary matches its fingerprint again", extra=self._who())
            self.canary_mismatch = None
            m.canary_degraded.set(0)
            return True
        extra = {**self._who(), "reason": verdict.reason, "canary": current.summary(),
                 "fingerprint": self.fingerprint.summary() if self.fingerprint is not None else None}
        if verdict.reason in ("tokens", "audio") and not confirmed:
            logger.warning("canary mismatch (%s), confirming with a second canary", verdict.detail, extra=extra)
            return False
        m.canary_mismatches.labels(verdict.reason).inc()
        m.canary_degraded.set(1)
        self.canary_mismatch = f"{verdict.reason}: {verdict.detail}"
        logger.error("canary mismatch: %s (canary_action %s)", self.canary_mismatch, self.config.canary_action,
                     extra=extra)
        return True

    def degraded(self) -> list[str]:
        """Why this model is degraded (its canary does not match its fingerprint), whatever
        ``canary_action`` does about it; empty when it is not."""
        if self.canary_mismatch is None:
            return []
        return [f"the canary does not match its fingerprint: {self.canary_mismatch}"]

    # -------------------------------------------------------------------------------- monitor
    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the monitor must not die
                logger.exception("monitor refresh failed")

    async def refresh(self) -> None:
        """Take a new engine snapshot, update pressure, degradation, metrics and the canary."""
        if self.pipeline is None:
            return
        now = self._clock()
        self.watch.track_progress(self.pipeline, now)
        if self.pipeline.stall(self.config.stall_timeout_s) is None:
            try:
                stats = await asyncio.to_thread(self.pipeline.engine_stats, 2.0)
            except TimeoutError:
                stats = None
            if stats is not None:
                self.snapshot = self.watch.snapshot(self.pipeline, stats, now)
        self.watch.observe_delivery(self.pipeline, self.admission, self.capacity, now)
        pressure = max(self.admission.in_flight / self.config.max_queue, self.snapshot.kv_usage)
        level = self.degradation.update(pressure, now)
        m = self.metrics
        m.degradation_level.set(level)
        for priority, count in self.admission.in_flight_by_priority().items():
            m.in_flight.labels(priority.name.lower()).set(count)
        m.ready.set(1 if self.readiness()[0] else 0)
        m.admission_rate.set(self.capacity.rate or 0.0)
        m.admission_saturated_rate.set(self.capacity.saturated_rate or 0.0)
        m.admission_utilization.set(self.capacity.utilization or 0.0)
        m.admission_saturated.set(1 if self.capacity.saturated else 0)
        m.admission_drain.set(self.admission.drain_s())
        due = self.last_canary_ok is None or now - self.last_canary_ok >= self.config.canary_interval_s
        if self.state == "ready" and due and not self._canary_running:
            asyncio.create_task(self.run_canary())

    # ------------------------------------------------------- the Backend seam (chorus/server/backend.py)
    @property
    def degradation_level(self) -> int:
        return self.degradation.level

    async def add_voice(self, data: bytes, name: str | None):
        return await asyncio.to_thread(voice_call, self.voices.add, data, name=name, param="upload")

    async def list_voices(self) -> list:
        return await asyncio.to_thread(voice_call, self.voices.list)

    async def voice_info(self, voice_id: str):
        return await asyncio.to_thread(voice_call, self.voices.info, voice_id)

    async def delete_voice(self, voice_id: str) -> bool:
        return await asyncio.to_thread(voice_call, self.voices.delete, voice_id)

    async def metrics_text(self) -> bytes:
        return self.metrics.render()

    def record_error(self, code: str, rule: str | None = None) -> None:
        self.metrics.record_error(code, rule)

    # ------------------------------------------------------------------------------- requests
    def model_ids(self) -> list[str]:
        return [self.config.model_id, *self.aliases]

    async def speech(self, body: SpeechBody, priority_given: str | None, request_id: str, *,
                     arrived: float, voice_clip: bytes | None = None, timed: bool = False) -> SpeechResponse:
        """Speak ``body``: checked, admitted, submitted, and its first audio awaited; the response
        streams the rest. ``priority_given``: the priority given outside the body (HTTP's
        ``X-Chorus-Priority``). ``voice_clip``: a reference clip to speak in instead of
        ``body.voice``, for this request only (gRPC's zero-shot data). ``timed``: the door
        places ``body.timestamps``' timings itself (gRPC's ``meta.words``): the response's chunks
        come with them (``respond``), whatever the stream format. Everything that fails before
        the first audio raises ``APIError``."""
        self.require_serving()
        priority = self._check(body, priority_given)
        if not timed:
            check_timestamps(body)
        call = await speak.open_call(self, body, priority, request_id, arrived, clip=voice_clip)
        rate = call.stream.plan.speed  # an SSML prosody rate scales the body's speed
        return await respond(call, body.response_format, streaming=streams(body),
                             speed=body.speed if rate is None else body.speed * rate, sse=body.stream_format == "sse",
                             timestamps=body.timestamps, timed=timed)

    async def convert(self, form: ConversionForm, priority_given: str | None, request_id: str, *,
                      arrived: float) -> SpeechResponse:
        """Convert ``form``'s source clip to its target voice (``speak.open_conversion``); the
        response streams as a speech response does."""
        self.require_serving()
        checks.check_model(form.fields.model, self.model_ids())
        priority = checks.priority(form.fields.priority, priority_given)
        call = await speak.open_conversion(self, form, priority, request_id, arrived)
        return await respond(call, form.fields.response_format, streaming=form.streams)

    async def configure_stream(self, body: SpeechBody) -> tuple[Priority, object]:
        """A stream's settings checked once, for all its pieces (a WebSocket connection's config;
        ``body.input`` is a placeholder): its priority and its voice, looked up."""
        priority = self._check(body, None)
        checks.check_sentence_language(body.language)
        return priority, await asyncio.to_thread(request_voice, self.voices, body.voice)

    async def open_call(self, body: SpeechBody, priority: Priority, request_id: str, arrived: float,
                        **options) -> SpeechCall:
        """One piece of a configured stream (``configure_stream``): its body checked (its text is
        new), admitted and submitted (``speak.open_call``, which takes ``options``)."""
        checks.check_body(body, self.config, self.pipeline.models.variant)
        return await speak.open_call(self, body, priority, request_id, arrived, **options)

    def refusing(self) -> bool:
        """Whether some priority is being refused whatever the text. Low priority has the smallest
        share of every rule, so it is refused whenever any priority is: one admission check, no
        body read (the HTTP layer asks this before it validates a body for certain_refusal)."""
        return self.state == "ready" and self.admission.certain_refusal(Priority.LOW, **speak.load(self)) is not None

    def certain_refusal(self, body: SpeechBody, priority_given: str | None) -> APIError | None:
        """The 429/503 any speech request of ``body``'s priority would get now, whatever its text
        (``Admission.certain_refusal``), or None: the request then takes the full path. Only
        for a body the full path would admit or refuse (not one it answers 400: that answer must
        not become a retryable 429) on a server that is serving."""
        if self.state != "ready":
            return None
        try:
            priority = self._check(body, priority_given)
        except APIError:
            return None
        return self.admission.certain_refusal(priority, **speak.load(self))

    def _check(self, body: SpeechBody, priority_given: str | None) -> Priority:
        """A speech body's checks before admission (``checks.py``): its priority."""
        checks.check_model(body.model, self.model_ids())
        priority = checks.priority(body.priority, priority_given)
        checks.check_body(body, self.config, self.pipeline.models.variant)
        return priority
