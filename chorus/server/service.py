"""The server's state between HTTP and the pipeline: loading, readiness, admission,
degradation, the monitor and the canary. The HTTP layer (``app.py``) holds no model logic; it
asks this object for everything.

Life: ``start()`` loads the models on a worker thread (``/health`` answers meanwhile, ``/ready``
says "loading"), warms up, runs a canary synthesis, and only then reports ready. A monitor task
refreshes the engine snapshot every ``MONITOR_INTERVAL_S`` (metrics, pressure, degradation) and
re-runs the canary every ``canary_interval_s``.
"""
from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from chorus.engine.request import Priority
from chorus.pipeline.errors import PipelineError
from chorus.pipeline.request import SpeechRequest
from chorus.server.admission import Admission, Ticket
from chorus.server.capacity import TOKENS_PER_SECOND, CapacityModel, stage_load_s
from chorus.server.config import ServerConfig
from chorus.server.degradation import Applied, DegradationPolicy
from chorus.server.errors import APIError
from chorus.server.metrics import EngineSnapshot, ServerMetrics, kv_fragmentation
from chorus.server.model_entries import aliases
from chorus.server.schemas import SpeechBody
from chorus.sampling.params import InvalidSamplingParams
from chorus.text.errors import MissingLanguagePackageError, TextError, UnsupportedLanguageError

if TYPE_CHECKING:  # the pipeline module imports torch; the service is built before any model loads
    from chorus.pipeline.pipeline import PipelineStats

logger = logging.getLogger("chorus.server")

MONITOR_INTERVAL_S = 0.25
CANARY_TEXT = "Chorus is ready."
CANARY_TOKENS = 25  # one second of audio: enough to run every stage once

# Unicode's control characters (category Cc: U+0000-U+001F, U+007F-U+009F) but tab and newlines,
# searched in C (every speech request's input is checked, refused ones too)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _delivery_advice(variant) -> str:
    """What steers a variant's delivery, for the error of ``instructions``: the fields it uses
    (``exaggeration`` needs its emotion input, ``cfg_weight`` its CFG); the variants with neither
    (turbo, nano) take paralinguistic tags in their text instead (docs/text.md)."""
    fields = [name for name, used in (("exaggeration", variant.t3.emotion_adv), ("cfg_weight", variant.t3.supports_cfg))
              if used]
    if fields:
        return f"steer delivery with {' and '.join(fields)}"
    return (f"{variant.name} ignores exaggeration and cfg_weight; steer delivery with paralinguistic tags in "
            "the input, such as [laugh] or [sigh]")


PRIORITIES = {"high": Priority.HIGH, "normal": Priority.NORMAL, "low": Priority.LOW}


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
        self.sampler = None  # DNSMOS's (chorus.quality.dnsmos.QualitySampler), with [quality] and a sample rate
        self.fingerprint = None  # what the first canary made (chorus.quality.fingerprint.Fingerprint)
        self.canary_mismatch: str | None = None  # why the last canary did not match it
        self._progress: tuple[float, int, int] | None = None  # (last progress, T3 tokens, vocoder passes)
        self._canary_running = False
        self._monitor: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._last_tokens: tuple[float, int] | None = None
        self._last_passes: tuple[int, int] = (0, 0)
        # the vocoder's graph captures and their seconds when warm-up ended (later ones: while serving)
        self._warmup_captures: tuple[int, float] = (0, 0.0)
        # (time, tokens delivered, busy, the pipeline's counters) at the last delivery observation
        self._last_delivery: tuple[float, float, bool, PipelineStats] | None = None
        self._last_vocoder_busy: tuple[float, float] | None = None  # (when, vocoder busy seconds)
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
            vocoder_stats = self.pipeline.vocoder.stats
            self._warmup_captures = (vocoder_stats.graph_captures, vocoder_stats.graph_capture_seconds)
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
        scorer = await asyncio.to_thread(dnsmos.DNSMOS)
        self.metrics.add_dnsmos()
        self.sampler = dnsmos.QualitySampler(self.config.quality_sample_rate, self.metrics.observe_dnsmos,
                                             self.metrics.dnsmos_skipped.inc, scorer=scorer)

    def sample_quality(self, stream) -> None:
        """Offer an ended speech request's audio to DNSMOS if it is sampled (never blocks)."""
        from chorus.pipeline.planner import SpeechPlan

        result, plan = stream._result, stream.plan
        if self.sampler is None or result is None or not isinstance(plan, SpeechPlan) or not self.sampler.sampled():
            return
        from chorus.quality.dnsmos import Job

        self.sampler.offer(Job(result.wav, result.sample_rate, float(plan.chunks[0].params.cfg_weight),
                               float(plan.exaggeration), stream.request_id))

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
        now = self._clock()
        self._track_progress(now)
        since = now - self._progress[0]
        if since > self.config.stall_timeout_s:
            return (f"no T3 token and no vocoder pass for {since:.1f} s with {self.pipeline.active_requests} "
                    f"request(s) in the pipeline")
        return None

    def _track_progress(self, now: float) -> None:
        """Note when the pipeline last made progress. An idle pipeline counts as progressing, and
        so does one inside a T3 step or a vocoder pass: whether that has run too long is
        ``Pipeline.stall``'s judgement (a pass of many streams on a loaded CPU takes seconds)."""
        pipe = self.pipeline
        tokens, passes = pipe.t3_tokens, pipe.vocoder.stats.passes
        if (self._progress is None or pipe.active_requests == 0 or pipe.working
                or (tokens, passes) != self._progress[1:]):
            self._progress = (now, tokens, passes)

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
        request = SpeechRequest(CANARY_TEXT, seed=0, max_new_tokens=CANARY_TOKENS, priority=Priority.HIGH,
                                deadline_s=self.config.canary_timeout_s, request_id=f"canary-{time.time_ns()}")
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
        self._track_progress(now)
        if self.pipeline.stall(self.config.stall_timeout_s) is None:
            try:
                stats = await asyncio.to_thread(self.pipeline.engine_stats, 2.0)
            except TimeoutError:
                stats = None
            if stats is not None:
                self.snapshot = self._snapshot(stats, now)
        self._observe_delivery(now)
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

    def _observe_delivery(self, now: float) -> None:
        """Feed the capacity model the audio delivered since the last refresh (busy time only) and
        how busy the busiest stage was meanwhile."""
        delivered, busy = self.admission.delivered_tokens, self.admission.in_flight > 0
        stats = self.pipeline.stats()
        if self._last_delivery is not None:
            then, before, was_busy, last = self._last_delivery
            load = stage_load_s(now - then, t3_busy_s=stats.t3_busy_s - last.t3_busy_s,
                                t3_steps=stats.t3_steps - last.t3_steps,
                                vocoder_busy_s=stats.vocoder_busy_s - last.vocoder_busy_s)
            self.capacity.observe_delivery(now - then, delivered - before, busy and was_busy, load)
        self._last_delivery = (now, delivered, busy, stats)

    def _snapshot(self, stats, now: float) -> EngineSnapshot:
        pipe = self.pipeline
        tokens = pipe.t3_tokens
        rate = 0.0
        if self._last_tokens is not None and now > self._last_tokens[0]:
            rate = (tokens - self._last_tokens[1]) / (now - self._last_tokens[0])
        self._last_tokens = (now, tokens)
        vocoder = pipe.vocoder.stats
        passes, items = vocoder.passes - self._last_passes[0], vocoder.items - self._last_passes[1]
        self._last_passes = (vocoder.passes, vocoder.items)
        busy_s, busy = pipe.vocoder_busy_s, 0.0
        if self._last_vocoder_busy is not None and now > self._last_vocoder_busy[0]:
            busy = min(1.0, (busy_s - self._last_vocoder_busy[1]) / (now - self._last_vocoder_busy[0]))
        self._last_vocoder_busy = (now, busy_s)
        kv = stats.kv
        return EngineSnapshot(
            kv_blocks_used=kv.num_used_blocks, kv_blocks_free=kv.num_free_blocks,
            prefix_hit_rate=kv.prefix_hit_rate, preemptions=stats.num_preemptions,
            t3_waiting=stats.num_waiting, t3_running=stats.num_running, t3_rows=stats.num_running_rows,
            t3_tokens=tokens, t3_tokens_per_s=rate, vocoder_passes=vocoder.passes, vocoder_items=vocoder.items,
            vocoder_items_per_pass=items / passes if passes else 0.0, pipeline_active=pipe.active_requests,
            vocoder_busy_ratio=busy, vocoder_eager_calls=vocoder.eager_runs,
            vocoder_graph_calls=vocoder.graph_replays - vocoder.covered_replays,
            vocoder_covered_calls=vocoder.covered_replays,
            vocoder_serving_captures=vocoder.graph_captures - self._warmup_captures[0],
            vocoder_serving_capture_seconds=vocoder.graph_capture_seconds - self._warmup_captures[1],
            kv_blocks_evictable=kv.num_cached_free_blocks,
            kv_fragmentation=kv_fragmentation(kv.num_free_blocks, kv.num_used_blocks, stats.num_running))

    # ------------------------------------------------------- the Backend seam (chorus/server/backend.py)
    @property
    def degradation_level(self) -> int:
        return self.degradation.level

    async def speech(self, body: SpeechBody, priority_header: str | None, request_id: str, *, arrived: float):
        from chorus.server.speech import open_speech

        return await open_speech(self, body, priority_header, request_id, arrived)

    async def convert(self, form, priority_header: str | None, request_id: str, *, arrived: float):
        from chorus.server.speech import open_conversion

        return await open_conversion(self, form, priority_header, request_id, arrived)

    async def add_voice(self, data: bytes, name: str | None):
        from chorus.server.speech import voice_call

        return await asyncio.to_thread(voice_call, self.voices.add, data, name=name, param="upload")

    async def list_voices(self) -> list:
        from chorus.server.speech import voice_call

        return await asyncio.to_thread(voice_call, self.voices.list)

    async def voice_info(self, voice_id: str):
        from chorus.server.speech import voice_call

        return await asyncio.to_thread(voice_call, self.voices.info, voice_id)

    async def delete_voice(self, voice_id: str) -> bool:
        from chorus.server.speech import voice_call

        return await asyncio.to_thread(voice_call, self.voices.delete, voice_id)

    async def metrics_text(self) -> bytes:
        return self.metrics.render()

    def record_error(self, code: str, rule: str | None = None) -> None:
        self.metrics.record_error(code, rule)

    # ------------------------------------------------------------------------------- quality
    def check_quality(self, check, stream, chars: int):
        """The audio checks of an ended request (``check``: its ``AudioCheck``; ``chars``: its
        input's length, 0 for a voice conversion), counted in the metrics; a flagged request is
        logged with its id."""
        from chorus.pipeline.planner import SpeechPlan

        result = stream._result
        speech = isinstance(stream.plan, SpeechPlan) and result is not None
        report = check.report(text_chars=chars if speech else None,
                              tokens=[c.tokens for c in result.chunks] if speech else None,
                              expected_seconds_per_char=self.config.tokens_per_char / TOKENS_PER_SECOND)
        self.metrics.observe_quality(report)
        if report.flags:
            logger.warning("audio flagged: %s", ", ".join(report.flags),
                           extra={"request_id": stream.request_id, **report.as_dict()})
        return report

    # ------------------------------------------------------------------------------- requests
    def model_ids(self) -> list[str]:
        return [self.config.model_id, *self.aliases]

    def check_model(self, model: str) -> None:
        if model not in self.model_ids():
            raise APIError(400, f"model {model!r} is not served here; use one of: {', '.join(self.model_ids())} "
                                f"(GET /v1/models)", code="model_not_found", param="model")

    def priority(self, field: str | None, header: str | None) -> Priority:
        name = field or (header.strip().lower() if header else "normal")
        if name not in PRIORITIES:
            raise APIError(400, f"priority must be high, normal or low, got {name!r}", code="invalid_parameter",
                           param="priority")
        return PRIORITIES[name]

    def admit(self, priority: Priority, body: SpeechBody, continues: Ticket | None = None) -> Ticket:
        """Admit ``body`` or raise a 429/503 ``APIError``: arithmetic on the latest estimates, no
        thread-pool or model work (the text is not even tokenized: its length predicts its cost).
        ``continues``: the ticket of the earlier piece of the same stream (``Admission.admit``)."""
        config = self.config
        chars = len(body.input)
        cap = body.max_new_tokens if body.max_new_tokens is not None else config.max_new_tokens
        chunks = -(-chars // config.max_chars)
        tokens = self.capacity.predict_tokens(chars, chunks=chunks, max_new_tokens=cap)
        variant = self.pipeline.models.variant
        cfg_weight = body.cfg_weight if body.cfg_weight is not None else variant.sampling.cfg_weight
        rows = chunks * (2 if variant.t3.supports_cfg and cfg_weight > 0 else 1)
        return self.admission.admit(priority, tokens=tokens, chars=chars, rows=rows, continues=continues,
                                    **self._load())

    def admit_conversion(self, priority: Priority, source_s: float) -> Ticket:
        """Admit a voice conversion of a ``source_s``-second source (25 speech tokens per second
        of it, no T3 rows) or raise a 429/503 ``APIError``."""
        return self.admission.admit(priority, tokens=source_s * TOKENS_PER_SECOND, chars=0, rows=0, **self._load())

    def conversion_planner(self):
        """The pipeline's conversion planner, or a 501 when the checkpoint was loaded without
        the voice models it needs."""
        try:
            return self.pipeline.conversion_planner
        except ValueError as exc:
            raise APIError(501, f"voice conversion is not available on this server: {exc}",
                           code="not_supported") from None

    def refusing(self) -> bool:
        """Whether some priority is being refused whatever the text. Low priority has the smallest
        share of every rule, so it is refused whenever any priority is: one admission check, no
        body read (the HTTP layer asks this before it validates a body for certain_refusal)."""
        return self.state == "ready" and self.admission.certain_refusal(Priority.LOW, **self._load()) is not None

    def certain_refusal(self, body: SpeechBody, priority_header: str | None) -> APIError | None:
        """The 429/503 any speech request of ``body``'s priority would get now, whatever its text
        (``Admission.certain_refusal``), or None: the request then takes the full path. Only
        for a body the full path would admit or refuse (not one it answers 400: that answer must
        not become a retryable 429) on a server that is serving."""
        if self.state != "ready":
            return None
        try:
            self.check_model(body.model)
            self.check_body(body)
            priority = self.priority(body.priority, priority_header)
        except APIError:
            return None
        return self.admission.certain_refusal(priority, **self._load())

    def _load(self) -> dict:
        """What admission weighs a request against: the start deadline, the queue's limit at the
        current degradation level, and the KV pool's use and waiters at the last snapshot."""
        return dict(start_deadline_s=self.start_deadline_s,
                    queue_limit=self.degradation.queue_limit(self.config.max_queue),
                    kv_usage=self.snapshot.kv_usage, waiting=self.snapshot.t3_waiting)

    def check_body(self, body: SpeechBody) -> None:
        """The body's checks against this server's limits (cheap: run before admission, so a
        request too long to serve is a 400, not a 429)."""
        config = self.config
        if len(body.input) > config.max_input_chars:
            raise APIError(400, f"input is {len(body.input)} characters; the limit is {config.max_input_chars} "
                                f"(split the text into several requests)", code="input_too_long", param="input")
        control = _CONTROL.search(body.input)
        if control is not None:
            raise APIError(400, f"input contains the control character U+{ord(control.group()):04X}; send plain text",
                           code="invalid_input", param="input")
        if body.instructions:
            raise APIError(400, f"instructions are not supported by Chatterbox models; "
                                f"{_delivery_advice(self.pipeline.models.variant)}",
                           code="unsupported_parameter", param="instructions")
        cap = config.max_new_tokens
        if cap is not None and body.max_new_tokens is not None and body.max_new_tokens > cap:
            raise APIError(400, f"max_new_tokens must be at most {cap} on this server, got {body.max_new_tokens}",
                           code="invalid_parameter", param="max_new_tokens")
        deadline = body.deadline_s if body.deadline_s is not None else config.default_deadline_s
        if deadline is not None and deadline > config.max_deadline_s:
            raise APIError(400, f"deadline_s must be at most {config.max_deadline_s:g}, got {deadline:g}",
                           code="invalid_parameter", param="deadline_s")

    def speech_request(self, body: SpeechBody, voice, priority: Priority, request_id: str,
                       listener: str | None = None) -> tuple[SpeechRequest, Applied]:
        """The pipeline request of a checked API body (:meth:`check_body`), with the current
        degradation applied; ``listener``: see ``SpeechRequest``."""
        config = self.config
        max_new_tokens = body.max_new_tokens if body.max_new_tokens is not None else config.max_new_tokens
        deadline = body.deadline_s if body.deadline_s is not None else config.default_deadline_s
        request = SpeechRequest(
            body.input, voice=voice, language=body.language, exaggeration=body.exaggeration,
            cfg_weight=body.cfg_weight, temperature=body.temperature, top_p=body.top_p, min_p=body.min_p,
            top_k=body.top_k, repetition_penalty=body.repetition_penalty, seed=body.seed,
            max_new_tokens=max_new_tokens, flow_steps=body.flow_steps, priority=priority,
            deadline_s=deadline, start_deadline_s=self.start_deadline_s, stream=True, listener=listener,
            request_id=request_id)
        request, applied = self.degradation.apply(request, self.pipeline.models.variant)
        for change in applied.changes:
            self.metrics.degraded.labels(change.split("=")[0]).inc()
        return request, applied

    def submit(self, request: SpeechRequest):
        """Plan and start a request (on a worker thread: planning tokenizes the text). Bad input
        becomes a 400 naming the parameter."""
        try:
            return self.pipeline.submit(request)
        except InvalidSamplingParams as exc:
            raise APIError(400, str(exc), code="invalid_parameter", param=exc.param) from None
        except UnsupportedLanguageError as exc:
            raise APIError(400, str(exc), code="unsupported_language", param="language") from None
        except MissingLanguagePackageError as exc:
            raise APIError(400, f"{exc}", code="language_unavailable", param="language") from None
        except TextError as exc:
            raise APIError(400, str(exc), code="invalid_input", param="input") from None
        except ValueError as exc:
            raise APIError(400, str(exc), code="invalid_parameter") from None
