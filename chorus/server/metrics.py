"""Prometheus metrics of one server (``GET /metrics``), on a registry of its own.

Request-side metrics are updated by the request handlers; engine-side values (KV blocks, batch
sizes, tokens/s, preemptions) come from the monitor's latest :class:`EngineSnapshot`, read at
scrape time, so a scrape never waits for the engine. Stage times (``chorus_stage_seconds``) are
observed by the pipeline's threads as they happen (``observe_stage``); GPU utilisation and
memory are read from NVML at scrape time, only when ``nvidia-ml-py`` is installed and the
pipeline runs on a CUDA device (``watch_device``): otherwise those metrics are not exported.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger("chorus.server")

LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# stage times run from a millisecond (a GPU decode step, encoding a piece) to minutes (a stalled step)
# the event loop's lag: a refusal's latency target is 50 ms, a healthy loop's lag a few ms
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STAGES = ("queue", "t3", "t3_prefill", "vocoder", "encode")
# error codes that are admission refusals, and the reason label they count under
REFUSAL_REASONS = {"queue_full": "queue_full", "overloaded": "overloaded", "memory_pressure": "memory_pressure"}
# the admission rules that answer `overloaded` (docs/server.md, "Admission")
OVERLOAD_RULES = ("start", "realtime")
DEADLINE_KINDS = ("start", "total")
WS_TURN_OUTCOMES = ("done", "cancelled", "error")
# the per-request audio checks (docs/quality.md)
CLIPPED_BUCKETS = (0.0, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0)
SILENT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.95, 1.0)
RMS_BUCKETS = (-80.0, -60.0, -50.0, -40.0, -35.0, -30.0, -25.0, -20.0, -15.0, -10.0, -5.0, 0.0)
PER_CHAR_BUCKETS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
LOOP_BUCKETS = (0, 3, 6, 10, 15, 25, 50, 100, 200, 500)
CANARY_MISMATCHES = ("tokens", "audio", "nonfinite", "silent")
# metrics exported only where they can be measured (NVML on a CUDA device)
# (and DNSMOS's, only with chorus-tts[quality] and a quality_sample_rate above 0)
OPTIONAL_METRICS = frozenset({"chorus_gpu_utilization_ratio", "chorus_gpu_memory_bytes", "chorus_dnsmos_score",
                              "chorus_dnsmos_skipped_requests", "chorus_dnsmos_scoring_seconds",
                              "chorus_dnsmos_worker_up", "chorus_dnsmos_worker_deaths"})
DNSMOS_BUCKETS = (1.0, 1.5, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 5.0)


def kv_fragmentation(free_blocks: int, used_blocks: int, running_requests: int) -> float:
    """The share of free KV blocks that a request of the typical size cannot use: the remainder
    of the free blocks after as many whole typical requests as fit, over the free blocks. The
    typical size is the blocks the running requests hold on average (none running: 0). A paged
    pool has no holes (any free block serves any request), so what strands memory is a remainder
    smaller than one request: the value reaches 1 when not one more typical request fits."""
    if free_blocks <= 0 or running_requests <= 0 or used_blocks <= 0:
        return 0.0
    typical = math.ceil(used_blocks / running_requests)
    return (free_blocks % typical) / free_blocks


@dataclass(frozen=True)
class EngineSnapshot:
    """What the monitor last saw of the pipeline (all zeros before the model is loaded)."""

    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prefix_hit_rate: float = 0.0
    preemptions: int = 0
    t3_waiting: int = 0
    t3_running: int = 0
    t3_rows: int = 0
    t3_tokens: int = 0
    t3_tokens_per_s: float = 0.0
    vocoder_passes: int = 0
    vocoder_items: int = 0
    vocoder_items_per_pass: float = 0.0
    vocoder_busy_ratio: float = 0.0
    vocoder_graph_calls: int = 0
    vocoder_covered_calls: int = 0
    vocoder_eager_calls: int = 0
    vocoder_serving_captures: int = 0
    vocoder_serving_capture_seconds: float = 0.0
    pipeline_active: int = 0
    kv_blocks_evictable: int = 0
    kv_fragmentation: float = 0.0

    @property
    def kv_usage(self) -> float:
        total = self.kv_blocks_used + self.kv_blocks_free
        return self.kv_blocks_used / total if total else 0.0


def _add_process_metrics(metrics, registry: CollectorRegistry) -> None:
    """The metrics of the serving process rather than of one model: error answers by type,
    admission refusals among them, WebSocket connections, and the process's own gauges."""
    metrics.errors = Counter("chorus_errors", "Errors by type (error code), request or not", ["type"],
                             registry=registry)
    metrics.refusals = Counter("chorus_admission_refusals", "Requests refused at admission, by reason",
                               ["reason"], registry=registry)
    metrics.overloaded = Counter("chorus_admission_overloaded", "Requests refused as overloaded, by the admission "
                                 "rule that refused them (start: predicted first audio too late; realtime: the "
                                 "real-time bound)", ["rule"], registry=registry)
    metrics.ws_connections = Gauge("chorus_ws_connections_open", "Voice-agent WebSocket connections open",
                                   registry=registry)
    metrics.loop_lag = Histogram("chorus_event_loop_lag_seconds", "How late the event loop ran a timer that was "
                                 "due (sampled every 50 ms): the wait of everything ready on it, the parsing and "
                                 "refusing of requests included", buckets=LOOP_LAG_BUCKETS, registry=registry)
    metrics.gc_pauses = Histogram("chorus_gc_pause_seconds", "Pauses of the cyclic garbage collector, which "
                                  "stop every thread, by generation (2: a full collection)", ["generation"],
                                  buckets=LOOP_LAG_BUCKETS, registry=registry)
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, open fds (Linux)
    for reason in REFUSAL_REASONS.values():
        metrics.refusals.labels(reason)
    for rule in OVERLOAD_RULES:
        metrics.overloaded.labels(rule)


def _record_error(metrics, code: str, rule: str | None = None) -> None:
    """An error answer with ``code``: counted by type, and as an admission refusal when it is
    one (a deadline miss is counted where the pipeline says which deadline passed); an
    ``overloaded`` refusal also by the ``rule`` that gave it."""
    metrics.errors.labels(code).inc()
    if code in REFUSAL_REASONS:
        metrics.refusals.labels(REFUSAL_REASONS[code]).inc()
    if code == "overloaded" and rule in OVERLOAD_RULES:
        metrics.overloaded.labels(rule).inc()


class ProcessMetrics:
    """The metrics of a server of several models that belong to no one model (errors are
    counted before a request is routed), and the scrape of everything: each model version's
    :class:`ServerMetrics` labelled ``model`` and ``version``."""

    def __init__(self, versions):
        """``versions``: returns [(model id, version label, ServerMetrics)] at scrape time."""
        self.registry = CollectorRegistry(auto_describe=True)
        _add_process_metrics(self, self.registry)
        self._scrape = CollectorRegistry(auto_describe=False)
        self._scrape.register(_VersionsCollector(self.registry, versions))

    def record_error(self, code: str, rule: str | None = None) -> None:
        _record_error(self, code, rule)

    def render(self) -> bytes:
        return generate_latest(self._scrape)


class _VersionsCollector:
    """The process's families as they are, then every model version's families with its
    ``model`` and ``version`` labels added; families the process owns (errors, refusals,
    WebSocket connections, process gauges) are taken from it alone, and the GPU's from the first
    version that has them (one device, whatever model reads it)."""

    def __init__(self, process: CollectorRegistry, versions):
        self.process, self.versions = process, versions

    def collect(self):
        from prometheus_client.metrics_core import Metric

        owned: set[str] = set()
        for family in self.process.collect():
            owned.add(family.name)
            yield family
        merged: dict[str, Metric] = {}
        for model_id, version, metrics in self.versions():
            for family in metrics.registry.collect():
                if family.name in owned:
                    continue
                device_wide = family.name in OPTIONAL_METRICS
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                elif device_wide:
                    continue
                extra = {} if device_wide else {"model": model_id, "version": version}
                for sample in family.samples:
                    out.add_sample(sample.name, {**extra, **sample.labels}, sample.value, sample.timestamp,
                                   sample.exemplar)
        yield from merged.values()


class ServerMetrics:
    def __init__(self, snapshot=lambda: EngineSnapshot()):
        """``snapshot``: returns the latest :class:`EngineSnapshot` (called at scrape time)."""
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("chorus_requests", "Speech requests by final status (ok or an error code)",
                                ["status"], registry=registry)
        _add_process_metrics(self, registry)
        self.stream_cuts = Counter("chorus_stream_cuts", "Responses cut after their first audio byte, by reason",
                                   ["reason"], registry=registry)
        self.ttfa = Histogram("chorus_time_to_first_audio_seconds", "Request arrival to its first audio byte",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram("chorus_request_duration_seconds", "Request arrival to its last audio byte",
                             buckets=LATENCY_BUCKETS, registry=registry)
        self.queue_time = Histogram("chorus_queue_time_seconds", "Request arrival to its first T3 token",
                                    buckets=LATENCY_BUCKETS, registry=registry)
        self.audio_seconds = Counter("chorus_audio_seconds", "Seconds of audio sent", registry=registry)
        self.in_flight = Gauge("chorus_requests_in_flight", "Admitted requests not yet finished, by priority",
                               ["priority"], registry=registry)
        self.degradation_level = Gauge("chorus_degradation_level",
                                       "Degradation level (0 normal .. 3; docs/server.md)", registry=registry)
        self.degraded = Counter("chorus_degraded_requests", "Requests whose settings degradation changed, by change",
                                ["change"], registry=registry)
        self.ready = Gauge("chorus_ready", "1 when /ready answers 200", registry=registry)
        self.admission_rate = Gauge("chorus_admission_tokens_per_second",
                                    "Admission's estimate of the speech tokens the server delivers per second "
                                    "with its busiest stage saturated",
                                    registry=registry)
        self.admission_saturated_rate = Gauge(
            "chorus_admission_saturated_tokens_per_second",
            "The speech tokens per second the server delivered while saturated, the rate the real-time bound "
            "reads (0 until measured)", registry=registry)
        self.admission_utilization = Gauge("chorus_admission_utilization",
                                           "The busiest stage's busy fraction as admission averages it", registry=registry)
        self.admission_saturated = Gauge("chorus_admission_saturated",
                                         "1 while admission counts the server as saturated (the real-time bound applies)",
                                         registry=registry)
        self.admission_drain = Gauge("chorus_admission_drain_seconds",
                                     "Admission's predicted seconds until everything in flight is delivered",
                                     registry=registry)
        self.stage_seconds = Histogram(
            "chorus_stage_seconds", "Time of one unit of work per stage: queue (a request's submission to its "
            "first T3 token), t3 (one T3 step), t3_prefill (one T3 step, of those, that computed prompt "
            "positions), vocoder (one vocoder pass), encode (one audio piece)",
            ["stage"], buckets=STAGE_BUCKETS, registry=registry)
        self.deadline_misses = Counter("chorus_deadline_misses", "Requests that missed a deadline, by kind "
                                       "(start: before their first audio; total: the whole request)",
                                       ["kind"], registry=registry)
        # the voice-agent WebSocket (docs/voice-agents.md)
        self.ws_turns = Counter("chorus_ws_turns", "Voice-agent WebSocket turns ended, by outcome "
                                "(done, cancelled, error)", ["outcome"], registry=registry)
        self.ws_ttfa = Histogram("chorus_ws_text_to_first_audio_seconds",
                                 "Per WebSocket turn: its first text delta to its first audio frame (the text "
                                 "threshold's wait included)", buckets=LATENCY_BUCKETS, registry=registry)
        for outcome in WS_TURN_OUTCOMES:
            self.ws_turns.labels(outcome)
        self._add_quality_metrics(registry)
        for stage in STAGES:  # every series exists from the start (a rate over nothing is 0, not absent)
            self.stage_seconds.labels(stage)
        for kind in DEADLINE_KINDS:
            self.deadline_misses.labels(kind)
        registry.register(_EngineCollector(snapshot))
        self._gpu = _GpuCollector()
        registry.register(self._gpu)

    def _add_quality_metrics(self, registry: CollectorRegistry) -> None:
        """The per-request audio checks and the canary's fingerprint (docs/quality.md)."""
        from chorus.quality.checks import REASONS

        self.audio_clipped = Histogram("chorus_audio_clipped_ratio", "Per request: share of samples at full scale",
                                       buckets=CLIPPED_BUCKETS, registry=registry)
        self.audio_silent = Histogram("chorus_audio_silent_ratio", "Per request: share of 20 ms frames below "
                                      "-50 dBFS", buckets=SILENT_BUCKETS, registry=registry)
        self.audio_rms = Histogram("chorus_audio_rms_dbfs", "Per request: RMS level in dB full scale",
                                   buckets=RMS_BUCKETS, registry=registry)
        self.audio_per_char = Histogram("chorus_audio_seconds_per_char", "Per speech request: audio seconds per "
                                        "input character", buckets=PER_CHAR_BUCKETS, registry=registry)
        self.audio_loop = Histogram("chorus_audio_token_loop_tokens", "Per speech request: the longest stretch of "
                                    "speech tokens repeating one n-gram back to back", buckets=LOOP_BUCKETS,
                                    registry=registry)
        self.audio_flagged = Counter("chorus_audio_flagged_requests", "Requests whose audio checks flagged them, "
                                     "by reason (one request may count under several)", ["reason"], registry=registry)
        self.audio_checked = Counter("chorus_audio_checked_requests", "Requests whose audio was checked",
                                     registry=registry)
        self.canary_degraded = Gauge("chorus_canary_degraded", "1 while the last canary's audio did not match the "
                                     "fingerprint recorded at its first run", registry=registry)
        self.canary_mismatches = Counter("chorus_canary_mismatches", "Canaries whose audio did not match the "
                                         "fingerprint, by reason", ["reason"], registry=registry)
        self.canary_snr = Gauge("chorus_canary_snr_db", "The last canary's audio against its fingerprint, in dB "
                                "(capped at 200: identical)", registry=registry)
        for reason in REASONS:
            self.audio_flagged.labels(reason)
        for reason in CANARY_MISMATCHES:
            self.canary_mismatches.labels(reason)

    def add_dnsmos(self) -> "DnsmosMetrics":
        """Export DNSMOS's metrics (only while its sampler runs): the sampler's listener."""
        return DnsmosMetrics(self.registry)

    def observe_quality(self, report) -> None:
        """One request's audio checks (a ``chorus.quality.checks.QualityReport``)."""
        self.audio_checked.inc()
        self.audio_clipped.observe(report.clipped_ratio)
        self.audio_silent.observe(report.silent_ratio)
        self.audio_rms.observe(max(report.rms_dbfs, -200.0))
        if report.seconds_per_char is not None:
            self.audio_per_char.observe(report.seconds_per_char)
        if report.loop_tokens is not None:
            self.audio_loop.observe(report.loop_tokens)
        for reason in report.flags:
            self.audio_flagged.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_stage(self, stage: str, seconds: float) -> None:
        """One unit of work of ``stage`` took ``seconds`` (thread-safe: the pipeline's threads
        call it; ``Pipeline.set_timing_listener``)."""
        self.stage_seconds.labels(stage).observe(seconds)

    def record_error(self, code: str, rule: str | None = None) -> None:
        _record_error(self, code, rule)

    def stream_cut(self, reason: str, deadline: str | None = None) -> None:
        """A response cut after its first byte (``reason``: the pipeline's, e.g. ``deadline``, with
        ``deadline`` the one that passed; or ``slow_reader``)."""
        self.stream_cuts.labels(reason).inc()
        if deadline is not None:
            self.deadline_misses.labels(deadline).inc()

    def watch_device(self, device) -> bool:
        """Export GPU utilisation and memory of ``device`` (a ``torch.device``) from NVML at
        scrape time. Returns False, and exports nothing, off CUDA or without ``nvidia-ml-py``."""
        return self._gpu.watch(device)


class _EngineCollector:
    def __init__(self, snapshot):
        self._snapshot = snapshot

    def describe(self):
        return []

    def collect(self):
        s: EngineSnapshot = self._snapshot()
        blocks = GaugeMetricFamily("chorus_kv_blocks", "KV-cache blocks by state", labels=["state"])
        blocks.add_metric(["used"], s.kv_blocks_used)
        blocks.add_metric(["free"], s.kv_blocks_free)
        yield blocks
        yield GaugeMetricFamily("chorus_kv_usage", "Fraction of KV-cache blocks in use", value=s.kv_usage)
        yield GaugeMetricFamily("chorus_prefix_cache_hit_rate",
                                "Prompt positions served from the prefix cache / positions looked up",
                                value=s.prefix_hit_rate)
        yield CounterMetricFamily("chorus_preemptions", "T3 requests preempted (recomputed later)",
                                  value=s.preemptions)
        yield GaugeMetricFamily("chorus_queue_depth", "T3 chunks waiting for a batch slot", value=s.t3_waiting)
        yield GaugeMetricFamily("chorus_t3_running", "T3 chunks in the running batch", value=s.t3_running)
        yield GaugeMetricFamily("chorus_t3_batch_rows", "Rows of the T3 batch (a CFG request has two)",
                                value=s.t3_rows)
        yield CounterMetricFamily("chorus_t3_tokens", "Speech tokens sampled by T3", value=s.t3_tokens)
        yield GaugeMetricFamily("chorus_t3_tokens_per_second", "Speech tokens per second, last monitor interval",
                                value=s.t3_tokens_per_s)
        yield CounterMetricFamily("chorus_vocoder_passes", "Batched S3Gen passes", value=s.vocoder_passes)
        yield GaugeMetricFamily("chorus_vocoder_batch_items", "Jobs per S3Gen pass, last monitor interval",
                                value=s.vocoder_items_per_pass)
        calls = CounterMetricFamily("chorus_vocoder_calls", "Flow and HiFT calls of S3Gen passes by how they "
                                    "ran: graph (their shape's CUDA graph replayed), covered (a larger graph "
                                    "replayed: their shape had none) or eager (kernels launched one by one: the "
                                    "CPU, graphs off, too many rows, or no graph to cover the shape)",
                                    labels=["mode"])
        calls.add_metric(["graph"], s.vocoder_graph_calls)
        calls.add_metric(["covered"], s.vocoder_covered_calls)
        calls.add_metric(["eager"], s.vocoder_eager_calls)
        yield calls
        yield CounterMetricFamily("chorus_vocoder_serving_graph_captures",
                                  "CUDA graphs the vocoder captured after warm-up: shapes warm-up did not cover "
                                  "(in a pass every stream in it waits; a covered shape's waits for an idle moment)",
                                  value=s.vocoder_serving_captures)
        yield CounterMetricFamily("chorus_vocoder_serving_graph_capture_seconds",
                                  "Time those captures took", value=s.vocoder_serving_capture_seconds)
        yield GaugeMetricFamily("chorus_pipeline_active_requests", "Requests inside the pipeline",
                                value=s.pipeline_active)
        yield GaugeMetricFamily("chorus_vocoder_busy_ratio",
                                "Share of the last monitor interval the vocoder thread spent in passes",
                                value=s.vocoder_busy_ratio)
        yield GaugeMetricFamily("chorus_kv_evictable_blocks",
                                "Free KV blocks that still hold prefix-cache content (evicted when reused)",
                                value=s.kv_blocks_evictable)
        yield GaugeMetricFamily("chorus_kv_fragmentation",
                                "Share of free KV blocks a request of the typical size cannot use "
                                "(docs/server.md)", value=s.kv_fragmentation)


class _GpuCollector:
    """GPU utilisation and memory from NVML (``nvidia-ml-py``), read at scrape time; yields
    nothing until ``watch`` found NVML and a CUDA device."""

    def __init__(self):
        self._nvml = None
        self._handle = None

    def watch(self, device) -> bool:
        if getattr(device, "type", None) != "cuda":
            return False
        try:
            import pynvml  # the nvidia-ml-py package (optional: chorus-tts[gpu-metrics])
        except ImportError:
            logger.info("nvidia-ml-py is not installed: GPU utilisation and memory are not exported")
            return False
        try:
            import torch

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            pci = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
            if None in pci:  # NVML's numbering matches CUDA's only without CUDA_VISIBLE_DEVICES
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            else:  # the same GPU as CUDA's device, whatever CUDA_VISIBLE_DEVICES reorders
                self._handle = pynvml.nvmlDeviceGetHandleByPciBusId("{:04x}:{:02x}:{:02x}.0".format(*pci))
        except Exception as exc:  # noqa: BLE001 - no GPU metrics is better than no server
            logger.warning("NVML is unavailable (%s): GPU utilisation and memory are not exported", exc)
            return False
        self._nvml = pynvml
        return True

    def describe(self):
        return []

    def collect(self):
        if self._nvml is None:
            return
        try:
            utilization = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:  # noqa: BLE001 - a failed read must not fail the scrape
            logger.exception("NVML read failed")
            return
        yield GaugeMetricFamily("chorus_gpu_utilization_ratio",
                                "Share of the last sample period the GPU was running kernels (NVML)",
                                value=utilization.gpu / 100)
        memory_family = GaugeMetricFamily("chorus_gpu_memory_bytes", "GPU memory by state (NVML, the whole GPU)",
                                          labels=["state"])
        memory_family.add_metric(["used"], memory.used)
        memory_family.add_metric(["total"], memory.total)
        yield memory_family


class DnsmosMetrics:
    """DNSMOS's metrics: the listener of ``chorus.quality.sampler.QualitySampler`` (its calls
    come from the sampler's feeder thread)."""

    def __init__(self, registry: CollectorRegistry):
        from chorus.quality.sampler import SKIP_REASONS

        self.scores = Histogram("chorus_dnsmos_score", "DNSMOS P.835 scores (1-5) of sampled requests, by score "
                                "(sig, bak, ovrl) and the request's CFG weight and exaggeration buckets",
                                ["score", "cfg_weight", "exaggeration"], buckets=DNSMOS_BUCKETS, registry=registry)
        self.skips = Counter("chorus_dnsmos_skipped_requests", "Sampled requests not scored, by reason: queue_full "
                             "(the worker was behind), worker_died (it died scoring it), worker_down (it stopped "
                             "restarting), failed (scoring raised)", ["reason"], registry=registry)
        self.seconds = Histogram("chorus_dnsmos_scoring_seconds", "Wall time of one DNSMOS scoring in the worker "
                                 "process", buckets=STAGE_BUCKETS, registry=registry)
        self.up = Gauge("chorus_dnsmos_worker_up", "1 while the DNSMOS worker process runs (0: restarting, or "
                        "stopped after repeated deaths)", registry=registry)
        self.deaths = Counter("chorus_dnsmos_worker_deaths", "DNSMOS worker processes that died (each restarted after a "
                              "backoff, up to a limit: docs/quality.md)", registry=registry)
        for reason in SKIP_REASONS:
            self.skips.labels(reason)

    def scored(self, job, scores, seconds: float) -> None:
        """One sampled request's scores."""
        from chorus.quality.dnsmos import CFG_EDGES, EXAGGERATION_EDGES, SCORES, bucket

        cfg, exaggeration = bucket(job.cfg_weight, CFG_EDGES), bucket(job.exaggeration, EXAGGERATION_EDGES)
        for name in SCORES:
            self.scores.labels(name, cfg, exaggeration).observe(getattr(scores, name))
        self.seconds.observe(seconds)

    def skipped(self, reason: str) -> None:
        self.skips.labels(reason).inc()

    def worker_up(self, up: bool) -> None:
        self.up.set(1 if up else 0)

    def worker_died(self) -> None:
        self.deaths.inc()
