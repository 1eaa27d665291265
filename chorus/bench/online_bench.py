"""``chorus bench online``'s closed-loop levels: a load test of a running ``chorus serve``, over HTTP.

Per concurrency level N, N clients (asyncio tasks sharing one httpx connection pool of N
connections; with ``client_processes`` P, split between P processes, each with its own pool and
event loop) send ``POST /v1/audio/speech`` back to back, each reading its response as a stream,
until the level's request budget is spent (``requests_per_level``) or its time is up
(``duration_s``; requests in flight then are finished and counted). Per request: its status, time
to the first audio byte, end-to-end time, the audio received, the real-time factor and whether a
player starting at the first byte would have run dry. Per level: counts by status, percentiles,
throughput, and what the server's ``/metrics`` said (counter deltas over the level, gauge peaks
polled during it).

The server is admission-controlled: 429 (queue full), 503 (memory pressure) and 504 (deadline)
answers are data about the server under load, counted in the report, never raised.

Only the client lives here (httpx and numpy; no model, no torch), so it runs from any machine
that reaches the server. The configs of the levels and of the overload run are here; the run that
strings them together is online_run.py. docs/benchmarks.md ("Online load test") explains every field.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import re
import time
import uuid
from dataclasses import dataclass, field

import httpx
import numpy as np

from chorus.loop_lag import watch_loop_lag

SAMPLE_RATE = 24_000  # the server's output rate; pcm is 16-bit little-endian mono
WAV_HEADER_BYTES = 44  # the streamed wav header (open-ended sizes), then pcm
MEASURED_FORMATS = ("pcm", "wav")  # audio seconds are counted from the bytes of these
CLIENT_LATE_WARNING_S = 0.1  # open loop: requests sent this much later than due (p99) warn of a busy client
RESPONSE_FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")
# The sentence `chorus bench stream` speaks (26 words), so in-process and HTTP figures compare.
DEFAULT_TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs back into the forest "
                "to find its friends before the sun goes down.")
DEFAULT_REQUESTS_PER_CLIENT = 4
# Request outcomes. ok: 200 and the whole body; 429/503/504: the server's answer (admission
# refused, memory pressure or shutting down, deadline passed before the first byte); other: any
# other HTTP status; cut: a 200 whose body did not end cleanly (the server cut the stream, the
# connection broke or timeout_s passed); client_error: no answer (connection refused or reset,
# or timeout_s passed first).
STATUSES = ("ok", "429", "503", "504", "other", "cut", "client_error")
REJECTIONS = ("429", "503", "504")
FAILURES = ("other", "cut", "client_error")
# Server metrics: counters reported as deltas over a level, gauges as the peak seen while polling.
# The vocoder's graph captures while serving (shapes its warm-up missed) stall every stream in
# their pass: a level with any is not measuring the steady state.
COUNTERS = {"t3_tokens": "chorus_t3_tokens_total", "preemptions": "chorus_preemptions_total",
            "audio_seconds": "chorus_audio_seconds_total", "vocoder_passes": "chorus_vocoder_passes_total",
            "vocoder_serving_graph_captures": "chorus_vocoder_serving_graph_captures_total",
            "vocoder_serving_graph_capture_s": "chorus_vocoder_serving_graph_capture_seconds_total"}
GAUGES = {"degradation_level_max": "chorus_degradation_level", "kv_usage_max": "chorus_kv_usage",
          "queue_depth_max": "chorus_queue_depth", "in_flight_max": "chorus_requests_in_flight",
          "t3_batch_rows_max": "chorus_t3_batch_rows"}
# Histograms reported as the quantiles of their bucket deltas over a level: the server's own view
# of a latency the client also measures (time from the application receiving a request to its
# first audio byte), so a client-side tail can be split into the server's part and the rest.
HISTOGRAMS = {"ttfa_s": "chorus_time_to_first_audio_seconds"}
# Counters reported per label value (deltas over a level): which admission rule answered a 429
# `overloaded` (docs/server.md, "Admission"); how the vocoder's flow and HiFT calls ran (graph,
# covered or eager: docs/server.md, "Metrics").
LABELLED_COUNTERS = {"overloaded_by_rule": ("chorus_admission_overloaded_total", "rule"),
                     "vocoder_calls_by_mode": ("chorus_vocoder_calls_total", "mode")}
# the server's event-loop lag and garbage-collector pauses (histograms of chorus/server/metrics.py)
_PAUSES = re.compile(r'^(chorus_event_loop_lag_seconds|chorus_gc_pause_seconds)_(bucket|count|sum)'
                     r'(?:\{([^}]*)\})?\s+(\S+)$', re.M)
LAG_THRESHOLDS = ("0.01", "0.05", "0.25")  # lag samples counted above these (seconds; bucket bounds)


class OnlineBenchError(Exception):
    """The load test cannot run (server unreachable, model or voice refused): one line for the user."""


def check_load(url: str, concurrency, text: str, max_new_tokens: int | None) -> tuple[str, tuple[int, ...]]:
    """The checks every load test of a running server makes (the HTTP levels and the voice
    agents): its base URL (trailing slash dropped), its concurrency levels (as a tuple), its text
    and its token cap. Raises ``ValueError`` naming the option."""
    url = url.rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"--url must be http://host:port or https://..., got {url!r}")
    levels = tuple(int(n) for n in concurrency)
    if not levels or any(n < 1 for n in levels):
        raise ValueError(f"--concurrency must be positive integers, got {levels!r}")
    if not text.strip():
        raise ValueError("--text must not be empty")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    return url, levels


@dataclass(frozen=True)
class OverloadConfig:
    """The open-loop run: ``arrival_rate`` (requests/s) or ``overload_multiple`` (of the measured
    capacity, in requests/s), bounded by ``requests`` and ``duration_s``; ``seed`` fixes the
    arrival times."""

    arrival_rate: float | None = None
    overload_multiple: float | None = None
    requests: int = 200
    duration_s: float = 60.0
    seed: int = 0

    def __post_init__(self):
        if (self.arrival_rate is None) == (self.overload_multiple is None):
            raise ValueError("give --arrival-rate or --overload-multiple (one of them)")
        for name in ("arrival_rate", "overload_multiple", "duration_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if self.requests < 1:
            raise ValueError(f"--overload-requests must be >= 1, got {self.requests}")


@dataclass
class OnlineBenchConfig:
    url: str
    api_key: str | None = None
    model: str | None = None  # None: the first id of GET /v1/models
    voice: str = "default"
    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    requests_per_level: int | None = None  # None and no duration_s: DEFAULT_REQUESTS_PER_CLIENT per client
    duration_s: float | None = None
    text: str = DEFAULT_TEXT
    response_format: str = "pcm"
    max_new_tokens: int | None = None  # None: the server's cap
    warmup: int = 1  # requests sent one at a time before the first level, not counted
    timeout_s: float = 300.0  # per request, from sending it to the end of its body
    honor_retry_after: bool = False  # after a 429/503, a client waits Retry-After before its next request
    ramp_s: float = 0.0  # a level's clients send their first requests spread over this long (0: all at once)
    metrics_interval_s: float = 0.5  # /metrics polling during a level (gauge peaks)
    settle_s: float = 0.5  # wait before the closing scrape: engine metrics refresh every 0.25 s
    extra_body: dict = field(default_factory=dict)  # more request fields (e.g. seed, priority)
    overload: OverloadConfig | None = None  # an open-loop overload run (overload_bench.py)
    client_processes: int = 1
    """Processes that send the requests (a level's clients, the overload mode's arrivals), each
    with its own event loop and connections, so that one busy client loop's lag does not add to
    the latencies it measures; this process polls ``/metrics``."""

    def __post_init__(self):
        self.url, self.concurrency = check_load(self.url, self.concurrency, self.text, self.max_new_tokens)
        if self.requests_per_level is not None and self.duration_s is not None:
            raise ValueError("give --requests-per-level or --duration-s, not both")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise ValueError(f"--requests-per-level must be >= 1, got {self.requests_per_level}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"--duration-s must be > 0, got {self.duration_s}")
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(f"--response-format must be one of {', '.join(RESPONSE_FORMATS)}, "
                             f"got {self.response_format!r}")
        if self.warmup < 0 or not self.timeout_s > 0:
            raise ValueError("--warmup must be >= 0 and --timeout-s > 0")
        if not (isinstance(self.ramp_s, (int, float)) and self.ramp_s >= 0):
            raise ValueError(f"--ramp-s must be a number >= 0, got {self.ramp_s!r}")
        if isinstance(self.client_processes, bool) or not isinstance(self.client_processes, int) \
                or self.client_processes < 1:
            raise ValueError(f"--client-processes must be an integer >= 1, got {self.client_processes!r}")

    def level_budget(self, concurrency: int) -> int | None:
        """Requests a level sends in all (None: as many as fit in ``duration_s``)."""
        if self.duration_s is not None:
            return None
        return self.requests_per_level or DEFAULT_REQUESTS_PER_CLIENT * concurrency


# ---------------------------------------------------------------------------------- one request

class Playback:
    """A player that starts at a stream's first byte and plays its audio at 1x: ``stall_s`` is
    how long it waited for audio in all. The stream is faster than real time when that is 0,
    i.e. when every chunk arrived no later than the audio before it had finished playing
    (chunk k received at t_k: t_k - t_1 <= audio in chunks 1..k-1)."""

    def __init__(self):
        self.first: float | None = None
        self.audio_s = 0.0
        self.stall_s = 0.0

    def receive(self, now: float, audio_s: float) -> None:
        if self.first is None:
            self.first = now
        else:
            runs_dry = self.first + self.audio_s + self.stall_s
            self.stall_s += max(0.0, now - runs_dry)
        self.audio_s += audio_s


@dataclass
class Outcome:
    """One request as the client saw it (times in seconds from sending it)."""

    status: str
    http_status: int | None = None
    code: str | None = None  # the error body's code (queue_full, memory_pressure, ...)
    message: str | None = None
    ttfa_s: float | None = None  # to the first body byte of a 200
    e2e_s: float | None = None  # to the end of the body (or of the error answer)
    bytes: int = 0
    audio_s: float | None = None  # pcm and wav only
    stall_s: float | None = None  # pcm and wav only
    retry_after_s: float | None = None
    version: str | None = None  # the model version that served it (X-Chorus-Model-Version)
    sent_s: float | None = None  # when it was sent, seconds from its level's start (closed-loop levels)
    late_s: float | None = None  # open loop: how long after its arrival time the client sent it


def _audio_seconds(fmt: str, nbytes: int) -> float:
    header = WAV_HEADER_BYTES if fmt == "wav" else 0
    return max(0, nbytes - header) // 2 / SAMPLE_RATE


def _status_name(http_status: int) -> str:
    return str(http_status) if str(http_status) in REJECTIONS else "other"


def _error_details(raw: bytes) -> tuple[str | None, str]:
    try:
        error = json.loads(raw)["error"]
        return error.get("code"), str(error.get("message"))
    except (ValueError, KeyError, TypeError):
        return None, raw[:200].decode("utf-8", "replace")


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


async def speak_once(client: httpx.AsyncClient, cfg: OnlineBenchConfig, body: dict) -> Outcome:
    """Send one speech request and read its response to the end, within ``cfg.timeout_s`` in all."""
    start = time.perf_counter()
    outcome = Outcome(status="client_error")  # until an answer comes
    playback = Playback()
    try:
        await asyncio.wait_for(_exchange(client, cfg, body, outcome, playback, start), cfg.timeout_s)
    except asyncio.TimeoutError:
        outcome.message = f"no complete answer within --timeout-s {cfg.timeout_s:g} s"
    except (httpx.HTTPError, OSError) as exc:
        outcome.message = f"{type(exc).__name__}: {exc}"
    if outcome.e2e_s is None:
        outcome.e2e_s = time.perf_counter() - start
    if cfg.response_format in MEASURED_FORMATS and outcome.bytes:
        outcome.audio_s, outcome.stall_s = playback.audio_s, playback.stall_s
    return outcome


async def _exchange(client: httpx.AsyncClient, cfg: OnlineBenchConfig, body: dict, outcome: Outcome,
                    playback: Playback, start: float) -> None:
    fmt = cfg.response_format
    # a key of its own per request: a model split between versions (A/B) spreads the bench's
    # requests by its weights instead of sending them all where its API key lands
    affinity = {"X-Chorus-Affinity": uuid.uuid4().hex}
    async with client.stream("POST", "/v1/audio/speech", json=body, headers=affinity) as response:
        outcome.http_status = response.status_code
        outcome.version = response.headers.get("x-chorus-model-version")
        if response.status_code != 200:
            outcome.status = _status_name(response.status_code)
            outcome.retry_after_s = _retry_after(response)
            raw = await response.aread()
            outcome.e2e_s = time.perf_counter() - start
            outcome.code, outcome.message = _error_details(raw)
            return
        outcome.status = "cut"  # until the body ends cleanly
        async for data in response.aiter_raw():
            if not data:
                continue
            now = time.perf_counter()
            if outcome.ttfa_s is None:
                outcome.ttfa_s = now - start
            before = _audio_seconds(fmt, outcome.bytes)
            outcome.bytes += len(data)
            playback.receive(now, _audio_seconds(fmt, outcome.bytes) - before)
    outcome.e2e_s = time.perf_counter() - start
    outcome.status = "ok"


# ---------------------------------------------------------------------------------- server metrics

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> the sum of every metric's samples over their labels. A scaled-out
    server also sends per-series sums labelled ``replica="total"``; they are skipped, so the
    replicas are not counted twice."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or 'replica="total"' in (match.group(2) or ""):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[match.group(1)] = totals.get(match.group(1), 0.0) + value
    return totals


def labelled_totals(text: str, name: str, label: str) -> dict[str, float]:
    """Prometheus text -> metric ``name``'s samples summed per value of ``label`` (over its other
    labels; ``replica="total"`` sums skipped, as in :func:`parse_metrics`)."""
    pattern = re.compile(rf'{label}="([^"]*)"')
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != name or 'replica="total"' in (match.group(2) or ""):
            continue
        value = pattern.search(match.group(2) or "")
        if value is not None:
            totals[value.group(1)] = totals.get(value.group(1), 0.0) + float(match.group(3))
    return totals


_BUCKET_BOUND = re.compile(r'le="([^"]+)"')


def parse_buckets(text: str, name: str) -> dict[float, float]:
    """Prometheus text -> the cumulative counts of histogram ``name``'s buckets by upper bound
    (``inf`` for ``+Inf``), summed over their other labels; per-replica sums labelled
    ``replica="total"`` are skipped as in :func:`parse_metrics`."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != f"{name}_bucket" or 'replica="total"' in (match.group(2) or ""):
            continue
        bound = _BUCKET_BOUND.search(match.group(2) or "")
        if bound is None:
            continue
        try:
            le, value = float(bound.group(1)), float(match.group(3))
        except ValueError:
            continue
        counts[le] = counts.get(le, 0.0) + value
    return counts


def bucket_quantiles(first: dict[float, float], last: dict[float, float]) -> dict:
    """The observations between two scrapes of one histogram: their ``count`` and, for p50 and
    p99, the upper bound of the bucket that holds that quantile (``p50_le``, ``p99_le``; None
    when nothing was observed, ``inf`` past the last finite bound)."""
    bounds = sorted(last)
    delta = [last[b] - first.get(b, 0.0) for b in bounds]
    count = delta[-1] if delta else 0.0
    out: dict = {"count": int(count)}
    for q in (50, 99):
        target = count * q / 100
        bound = next((b for b, c in zip(bounds, delta) if c >= target), None) if count > 0 else None
        out[f"p{q}_le"] = "+Inf" if bound == math.inf else bound
    return out


@dataclass
class LevelClock:
    begin: float  # time.perf_counter() when the level's load started
    wall_s: float = 0.0  # from begin to the load's end (set when it ends)


class MetricsWatch:
    """Scrapes /metrics at a level's start and end (counter deltas, histogram quantiles of the
    level's observations) and polls it in between (gauge peaks). A server without /metrics leaves
    ``error`` set and the figures out."""

    def __init__(self, client: httpx.AsyncClient, counters: dict[str, str] = COUNTERS,
                 gauges: dict[str, str] = GAUGES, histograms: dict[str, str] | None = None):
        self.client = client
        self.counters, self.gauges = counters, gauges
        self.histograms = histograms or {}
        self.error: str | None = None
        self.scrapes = 0
        self.first: dict[str, float] | None = None
        self.last: dict[str, float] | None = None
        self._first_text = self._last_text = ""  # histograms are read from these two alone
        self.peaks = {key: 0.0 for key in gauges}

    async def scrape(self) -> dict[str, float] | None:
        try:
            response = await self.client.get("/metrics")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self.error = f"GET /metrics failed: {type(exc).__name__}: {exc}"
            return None
        values = parse_metrics(response.text)
        self.scrapes += 1
        for key, name in self.gauges.items():
            self.peaks[key] = max(self.peaks[key], values.get(name, 0.0))
        self.first = self.first or values
        self.last = values
        self._first_text = self._first_text or response.text
        self._last_text = response.text
        return values

    async def poll(self, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except asyncio.TimeoutError:
                await self.scrape()

    @contextlib.asynccontextmanager
    async def level(self, interval_s: float, settle_s: float):
        """Around a level's load: the opening scrape, a poll every ``interval_s`` while the load
        runs, and the closing scrape ``settle_s`` after it ends. Yields the level's
        :class:`LevelClock` (its ``wall_s`` set when the load ends)."""
        await self.scrape()
        stop = asyncio.Event()
        poller = asyncio.create_task(self.poll(interval_s, stop))
        clock = LevelClock(time.perf_counter())
        try:
            yield clock
        finally:
            clock.wall_s = time.perf_counter() - clock.begin
            stop.set()
            await poller
        await asyncio.sleep(settle_s)
        await self.scrape()

    def report(self, wall_s: float) -> dict:
        if self.first is None or self.last is None or self.scrapes < 2:
            return {"error": self.error or "no /metrics scrapes"}
        out: dict = {key: round(self.last.get(name, 0.0) - self.first.get(name, 0.0), 3)
                     for key, name in self.counters.items()}
        out["t3_tokens_per_s"] = round(out["t3_tokens"] / wall_s, 1) if wall_s > 0 else None
        out.update({key: round(value, 4) for key, value in self.peaks.items()})
        for key, name in self.histograms.items():
            out[key] = bucket_quantiles(parse_buckets(self._first_text, name), parse_buckets(self._last_text, name))
        for key, (name, label) in LABELLED_COUNTERS.items():
            first = labelled_totals(self._first_text, name, label)
            out[key] = {value: round(count - first.get(value, 0.0), 3)
                        for value, count in labelled_totals(self._last_text, name, label).items()}
        out["stage_seconds"] = stage_means(self._first_text, self._last_text)
        out["pauses"] = pause_report(server_pauses(self._first_text), server_pauses(self._last_text))
        out["scrapes"] = self.scrapes
        return out


def stage_means(first: str, last: str) -> dict[str, dict]:
    """Per stage of ``chorus_stage_seconds`` (queue: submission to first T3 token; t3: a step;
    t3_prefill: a step, of those, that computed prompt positions; vocoder: a pass; encode: an
    audio piece), the units observed between two /metrics texts and their mean seconds (None when
    none was); and ``t3_decode``, the t3 steps that were not t3_prefill's, where both are
    exported."""
    sums = [labelled_totals(text, "chorus_stage_seconds_sum", "stage") for text in (first, last)]
    counts = [labelled_totals(text, "chorus_stage_seconds_count", "stage") for text in (first, last)]
    totals = {stage: (counts[1][stage] - counts[0].get(stage, 0.0), sums[1].get(stage, 0.0) - sums[0].get(stage, 0.0))
              for stage in counts[1]}
    if "t3" in totals and "t3_prefill" in totals:
        (steps, seconds), (prefills, prefill_seconds) = totals["t3"], totals["t3_prefill"]
        totals["t3_decode"] = (steps - prefills, seconds - prefill_seconds)
    return {stage: {"count": int(count), "mean_s": round(seconds / count, 6) if count > 0 else None}
            for stage, (count, seconds) in sorted(totals.items())}


def server_pauses(text: str) -> dict[str, float] | None:
    """The server's cumulative event-loop lag samples (all, and above each of ``LAG_THRESHOLDS``;
    their sum in seconds) and its full garbage collections (count, seconds), from /metrics;
    None from a server that exports neither."""
    out = {"lag_samples": 0.0, "lag_s": 0.0, **{f"lag_over_{t}": 0.0 for t in LAG_THRESHOLDS},
           "gc_full": 0.0, "gc_full_s": 0.0}
    seen = False
    for name, kind, labels, value in _PAUSES.findall(text):
        labels = labels or ""
        if 'replica="total"' in labels:
            continue
        seen, value = True, float(value)
        if name == "chorus_gc_pause_seconds":
            if 'generation="2"' in labels and kind in ("count", "sum"):
                out["gc_full" if kind == "count" else "gc_full_s"] += value
        elif kind == "count":
            out["lag_samples"] += value
            for t in LAG_THRESHOLDS:  # above t = all samples - those at or below t
                out[f"lag_over_{t}"] += value
        elif kind == "sum":
            out["lag_s"] += value
        else:
            for t in LAG_THRESHOLDS:
                if f'le="{t}"' in labels:
                    out[f"lag_over_{t}"] -= value
    return out if seen else None


def pause_report(before: dict | None, after: dict | None) -> dict | None:
    """What the server's event loop and garbage collector did between two samples' pauses."""
    if not before or not after:
        return None
    delta = {key: after[key] - before[key] for key in after}
    samples = delta["lag_samples"]
    return {
        "lag_samples": int(samples),
        "lag_mean_ms": round(1000 * delta["lag_s"] / samples, 3) if samples else None,
        **{f"lag_share_over_{float(t) * 1000:g}ms": round(delta[f"lag_over_{t}"] / samples, 5) if samples else None
           for t in LAG_THRESHOLDS},
        "gc_full_collections": int(delta["gc_full"]),
        "gc_full_pause_s": round(delta["gc_full_s"], 4),
        "gc_full_pause_mean_ms": round(1000 * delta["gc_full_s"] / delta["gc_full"], 3) if delta["gc_full"] else None,
    }


# ---------------------------------------------------------------------------------- a level

def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def summarize(concurrency: int, outcomes: list[Outcome], wall_s: float, fmt: str) -> dict:
    """The per-level figures of the report (docs/benchmarks.md, "Online load test")."""
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in STATUSES}
    ok = [o for o in outcomes if o.status == "ok"]
    ttfa = [o.ttfa_s for o in ok if o.ttfa_s is not None]
    e2e = [o.e2e_s for o in ok]
    refused_at = [o.sent_s for o in outcomes if o.status in REJECTIONS and o.sent_s is not None]
    measured = fmt in MEASURED_FORMATS
    codes: dict[str, int] = {}
    for o in outcomes:
        if o.status != "ok":
            key = o.code or (f"http_{o.http_status}" if o.http_status else o.status)
            codes[key] = codes.get(key, 0) + 1
    samples = [f"{o.status} {o.http_status or ''} {o.code or ''}: {o.message}".replace("  ", " ")
               for o in outcomes if o.status in FAILURES][:5]
    level = {
        "concurrency": concurrency, "requests": len(outcomes), "ok": counts["ok"], "status": counts,
        "rejected": sum(counts[s] for s in REJECTIONS), "failed": sum(counts[s] for s in FAILURES),
        "rejected_sent_s": {"p50": _pct(refused_at, 50), "p90": _pct(refused_at, 90), "max": _pct(refused_at, 100)},
        "error_codes": codes, "error_samples": samples, "wall_s": round(wall_s, 3),
        "ttfa_s": {"p50": _pct(ttfa, 50), "p95": _pct(ttfa, 95), "p99": _pct(ttfa, 99), "max": _pct(ttfa, 100)},
        "e2e_s": {"p50": _pct(e2e, 50), "p95": _pct(e2e, 95), "p99": _pct(e2e, 99), "max": _pct(e2e, 100)},
        "bytes": sum(o.bytes for o in ok),
        "audio_s": None, "rtf": {"p50": None, "min": None}, "faster_than_realtime": None,
        "rtf_at_least_1": None, "stall_s": {"p50": None, "max": None}, "throughput_audio_s_per_s": None,
    }
    if measured:
        audio = [o.audio_s or 0.0 for o in ok]
        rtf = [a / o.e2e_s for a, o in zip(audio, ok) if o.e2e_s]
        stalls = [o.stall_s or 0.0 for o in ok]
        level.update({
            "audio_s": round(sum(audio), 3),
            "rtf": {"p50": _pct(rtf, 50), "min": _pct(rtf, 0)},
            "faster_than_realtime": round(sum(1 for s in stalls if s == 0.0) / len(ok), 4) if ok else None,
            "rtf_at_least_1": round(sum(1 for r in rtf if r >= 1.0) / len(rtf), 4) if rtf else None,
            "stall_s": {"p50": _pct(stalls, 50), "max": _pct(stalls, 100)},
            "throughput_audio_s_per_s": round(sum(audio) / wall_s, 3) if wall_s > 0 else None,
        })
    level["versions"] = _by_version(ok)
    return level


def _by_version(ok: list[Outcome]) -> dict[str, dict]:
    """Per model version that served (an A/B split): its share of the requests that ended ok and
    their latencies."""
    out = {}
    for version in sorted({o.version for o in ok if o.version is not None}):
        mine = [o for o in ok if o.version == version]
        ttfa = [o.ttfa_s for o in mine if o.ttfa_s is not None]
        e2e = [o.e2e_s for o in mine]
        out[version] = {"ok": len(mine), "ttfa_s": {"p50": _pct(ttfa, 50), "p95": _pct(ttfa, 95), "p99": _pct(ttfa, 99)},
                        "e2e_s": {"p50": _pct(e2e, 50), "p99": _pct(e2e, 99)}}
    return out


def auth_headers(key: str | None) -> dict[str, str]:
    """The ``Authorization`` header that carries an API key (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


async def run_clients(cfg: OnlineBenchConfig, body: dict, starts: list[float], budget: int | None,
                      begin: float) -> tuple[list[Outcome], list[float]]:
    """Closed-loop clients on this process's event loop, client i from ``starts[i]`` seconds after
    ``begin`` (this process's ``time.perf_counter()``): each sends a request, reads its answer,
    and sends the next, until ``budget`` requests were sent by them all (None: until
    ``cfg.duration_s`` after ``begin``). Their outcomes and this loop's lag samples
    (``chorus.loop_lag``)."""
    clients = len(starts)
    headers = auth_headers(cfg.api_key)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0), pool=None)
    stop_at = begin + cfg.duration_s if cfg.duration_s is not None else None
    remaining = [budget]
    outcomes: list[Outcome] = []
    lag: list[float] = []

    async def client_loop(client: httpx.AsyncClient, start: float) -> None:
        if stop_at is not None and begin + start >= stop_at:
            return  # its turn in the ramp comes after the level's end
        await asyncio.sleep(max(0.0, begin + start - time.perf_counter()))
        while True:
            if budget is not None:
                if remaining[0] <= 0:
                    return
                remaining[0] -= 1  # one event loop: no lock needed
            elif time.perf_counter() >= stop_at:
                return
            sent_s = time.perf_counter() - begin
            outcome = await speak_once(client, cfg, body)
            outcome.sent_s = round(sent_s, 4)
            outcomes.append(outcome)
            if cfg.honor_retry_after and outcome.status in ("429", "503") and outcome.retry_after_s:
                await asyncio.sleep(outcome.retry_after_s)

    async with httpx.AsyncClient(base_url=cfg.url, headers=headers, limits=limits, timeout=timeout) as client:
        await asyncio.sleep(max(0.0, begin - time.perf_counter()))
        lag_watch = asyncio.create_task(watch_loop_lag(lag.append))
        try:
            await asyncio.gather(*(client_loop(client, start) for start in starts))
        finally:
            lag_watch.cancel()
    return outcomes, lag


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts that differ by at most one, larger ones first."""
    assert parts >= 1, parts
    return [total // parts + (k < total % parts) for k in range(parts)]


async def run_level(cfg: OnlineBenchConfig, body: dict, concurrency: int) -> dict:
    """N clients back to back (from ``cfg.client_processes`` processes, at most one client
    each); see the module docstring."""
    budget = cfg.level_budget(concurrency)
    processes = min(cfg.client_processes, concurrency)
    starts = [cfg.ramp_s * i / concurrency for i in range(concurrency)]  # client i's first request
    budgets = [None] * processes if budget is None else shares(budget, processes)
    pool = None
    if processes > 1:  # client i in process i mod P, so every process's clients span the ramp
        pool = ClientProcesses(f"level-{concurrency}", run_clients,
                               [(cfg, body, starts[k::processes], b) for k, b in enumerate(budgets)])
    headers = auth_headers(cfg.api_key)
    try:
        if pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, pool.start)
        async with httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=10.0) as scraper:
            watch = MetricsWatch(scraper, histograms=HISTOGRAMS)
            async with watch.level(cfg.metrics_interval_s, cfg.settle_s) as clock:
                if pool is None:
                    outcomes, client_lag = await run_clients(cfg, body, starts, budget, clock.begin)
                    senders = None
                else:
                    shards, client_lag, senders = await pool.run(clock.begin)
                    outcomes = [o for shard in shards for o in shard]
    finally:
        if pool is not None:
            pool.close()
    wall = clock.wall_s
    level = summarize(concurrency, outcomes, wall, cfg.response_format)
    # a client-side latency the server's histogram does not see is either the client's loop (this)
    # or the server's before its handler runs (its loop's lag: server["pauses"])
    level["client_loop_lag_s"] = lag_summary(client_lag)
    level["client_processes"] = processes
    if senders is not None:
        level["client_senders"] = senders
    level["server"] = watch.report(wall)
    return level


# ---------------------------------------------------------------------------------- client processes

def lag_summary(lag: list[float]) -> dict:
    """Event-loop lag samples in a report: how many, p50, p99 and max (seconds)."""
    return {"samples": len(lag), "p50": _pct(lag, 50), "p99": _pct(lag, 99), "max": _pct(lag, 100)}


def sender_summary(pid: int, outcomes: list[Outcome], lag: list[float]) -> dict:
    """One client process in the report: its pid, the requests it sent, its loop's lag."""
    return {"pid": pid, "requests": len(outcomes),
            "loop_lag_s": {"samples": len(lag), "p99": _pct(lag, 99), "max": _pct(lag, 100)}}


def _client_process_main(conn, work, args: tuple) -> None:
    """A client process: say it is ready (its imports done), take the start as a wall-clock time,
    run ``work(*args, begin)`` on its own loop, hand back ``(its pid, *what work returned)`` or
    the error that stopped it."""
    try:
        conn.send("ready")
        start_epoch = conn.recv()
        begin = time.perf_counter() + (start_epoch - time.time())
        conn.send((os.getpid(), *asyncio.run(work(*args, begin))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(RuntimeError(f"a bench client process failed: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class ClientProcesses:
    """One spawned process per entry of ``shards`` (none inherits this process's threads or
    loop), each running ``await work(*shard, begin)`` (a module-level coroutine function that
    returns ``(outcomes, lag samples)``); :meth:`start` returns once every one has imported what
    it needs, so the first request is not late by a process start."""

    def __init__(self, name: str, work, shards: list[tuple]):
        context = multiprocessing.get_context("spawn")
        self._pipes, self._children = [], []
        for k, shard in enumerate(shards):
            parent_end, child_end = context.Pipe()
            child = context.Process(target=_client_process_main, args=(child_end, work, shard),
                                    daemon=True, name=f"bench-{name}-client-{k}")
            self._pipes.append(parent_end)
            self._children.append(child)

    def start(self) -> None:
        for child in self._children:
            child.start()
        for pipe, child in zip(self._pipes, self._children):
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError(f"{child.name} did not start within 120 s")

    async def run(self, begin: float) -> tuple[list[list[Outcome]], list[float], list[dict]]:
        """Start every process's work at ``begin`` (this process's ``perf_counter``); its
        outcomes per process (in ``shards`` order), every process's lag samples, and what each
        sent (:func:`sender_summary`)."""
        start_epoch = time.time() + (begin - time.perf_counter())
        for pipe in self._pipes:
            pipe.send(start_epoch)
        loop = asyncio.get_running_loop()
        answers = [await loop.run_in_executor(None, pipe.recv) for pipe in self._pipes]
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return ([shard for _, shard, _ in answers], [lag for _, _, lags in answers for lag in lags],
                [sender_summary(pid, shard, lags) for pid, shard, lags in answers])

    def close(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        for child in self._children:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
                child.join()


# ---------------------------------------------------------------------------------- the run

async def first_model(url: str, client: httpx.AsyncClient) -> str:
    """The first id of the server's ``GET /v1/models`` (the model a run uses unless told)."""
    try:
        response = await client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise OnlineBenchError(f"cannot reach the server at {url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise OnlineBenchError(f"GET {url}/v1/models answered {response.status_code}: "
                               f"{_error_details(response.content)[1]}")
    try:
        data = response.json().get("data") or []
    except (ValueError, AttributeError):
        data = []
    if not data:
        raise OnlineBenchError(f"GET {url}/v1/models lists no model; pass --model")
    return data[0]["id"]


def request_body(cfg: OnlineBenchConfig, model: str) -> dict:
    # stream: wav and flac are otherwise sent whole, and time to first audio is what is measured
    body = {"model": model, "input": cfg.text, "voice": cfg.voice, "response_format": cfg.response_format,
            "stream": True, **cfg.extra_body}
    if cfg.max_new_tokens is not None:
        body["max_new_tokens"] = cfg.max_new_tokens
    return body
