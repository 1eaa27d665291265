"""Prometheus metrics of one server (``GET /metrics``), on a registry of its own.

Request-side metrics are updated by the request handlers; engine-side values (KV blocks, batch
sizes, tokens/s, preemptions) come from the monitor's latest :class:`EngineSnapshot`, read at
scrape time, so a scrape never waits for the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


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
    pipeline_active: int = 0

    @property
    def kv_usage(self) -> float:
        total = self.kv_blocks_used + self.kv_blocks_free
        return self.kv_blocks_used / total if total else 0.0


class ServerMetrics:
    def __init__(self, snapshot=lambda: EngineSnapshot()):
        """``snapshot``: returns the latest :class:`EngineSnapshot` (called at scrape time)."""
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("chorus_requests", "Speech requests by final status (ok or an error code)",
                                ["status"], registry=registry)
        self.errors = Counter("chorus_errors", "Errors by type (error code), request or not", ["type"],
                              registry=registry)
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
                                    "Admission's estimate of the speech tokens delivered per second (busy time)",
                                    registry=registry)
        self.admission_drain = Gauge("chorus_admission_drain_seconds",
                                     "Admission's predicted seconds until everything in flight is delivered",
                                     registry=registry)
        ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, open fds (Linux)
        registry.register(_EngineCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)


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
        yield GaugeMetricFamily("chorus_pipeline_active_requests", "Requests inside the pipeline",
                                value=s.pipeline_active)
