"""What a running server's ``/metrics`` said during a load test: counter deltas over a level,
gauge peaks polled during it, quantiles of histogram buckets, per-stage means, and the server's
event-loop lag and garbage-collector pauses. Shared by the HTTP levels, the overload run and the
voice agents; docs/benchmarks.md ("Online load test") explains every field."""
from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from dataclasses import dataclass

import httpx

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
