"""``chorus bench online --arrival-rate R`` (or ``--overload-multiple X``): an open-loop overload run.

Closed-loop clients (online_levels.py) slow down when the server does, so they never overload
it. Here requests arrive on their own clock, as independent users do: a Poisson process at
``arrival_rate`` requests per second (or ``overload_multiple`` times the capacity the closed-loop
levels measured), until ``requests`` were sent or ``duration_s`` passed, whichever comes first;
the requests in flight then finish (each within ``timeout_s``). What a server that keeps its
promises shows: goodput (audio seconds per second of the requests that completed) holds near its
capacity, the excess is refused at once (429/503 in milliseconds, with ``Retry-After``), and
what was admitted finishes (no 504 and no cut after admission). ``/metrics`` and ``/ready`` are
polled meanwhile: KV blocks in use, the process's resident memory, the requests in flight and the
readiness answer, as a timeline; one sample before the first request and one after the drain
(once nothing is in flight) show what the run left behind. docs/benchmarks.md ("Overload mode")
explains every field.
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import time

import httpx

from chorus.bench.client_processes import ClientProcesses, lag_summary, sender_summary
from chorus.bench.online_bench import (MEASURED_FORMATS, OnlineBenchConfig, Outcome, OverloadConfig, _pct, auth_headers,
                                       speak_once)
from chorus.bench.server_metrics import parse_metrics, pause_report, server_pauses
from chorus.bench.speech_client import speech_client
from chorus.loop_lag import watch_loop_lag

REFUSALS = ("429", "503")  # answered before any work: admission, memory pressure, not ready
_KV_USED = re.compile(r'^chorus_kv_blocks\{([^}]*)\}\s+(\S+)', re.M)


REALTIME_SHARE = 0.95  # a level serves in real time when this share of its streams never stalled


def capacity_of(levels: list[dict]) -> float:
    """Completed requests per second of the best closed-loop level (0 when none completed)."""
    return max((level["ok"] / level["wall_s"] for level in levels if level["wall_s"] > 0), default=0.0)


def realtime_capacity_of(levels: list[dict]) -> float | None:
    """:func:`capacity_of` over the levels whose streams played without a stall (at least
    ``REALTIME_SHARE`` of the completed ones): the load served as a streaming client needs it.
    None when no level qualifies or the format's audio is not measured."""
    rates = [level["ok"] / level["wall_s"] for level in levels
             if level["wall_s"] > 0 and (level.get("faster_than_realtime") or 0.0) >= REALTIME_SHARE]
    return max(rates) if rates else None


def arrival_times(rate: float, count: int, duration_s: float, seed: int) -> list[float]:
    """Poisson arrivals (seconds from the start) at ``rate``, at most ``count``, before ``duration_s``."""
    rng = random.Random(seed)
    times, now = [], 0.0
    while len(times) < count:
        now += rng.expovariate(rate)
        if now >= duration_s:
            break
        times.append(now)
    return times


def kv_blocks_used(text: str) -> float:
    """``chorus_kv_blocks{state="used"}`` summed over replicas (their ``total`` series skipped)."""
    return sum(float(value) for labels, value in _KV_USED.findall(text)
               if 'state="used"' in labels and 'replica="total"' not in labels)


async def _sample(client: httpx.AsyncClient, begin: float) -> dict | None:
    """One timeline point: /metrics' gauges, /ready's status code and, when not 200, why not
    (the server's ``reason``, or the client's error when no answer came); None if /metrics failed."""
    try:
        response = await client.get("/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    values = parse_metrics(response.text)
    reason = None
    try:
        answer = await client.get("/ready")
        ready = answer.status_code
        if ready != 200:
            reason = _ready_reason(answer)
    except httpx.HTTPError as exc:
        ready, reason = None, f"no answer: {type(exc).__name__}"  # counted as not ready
    return {"t_s": round(time.perf_counter() - begin, 3), "kv_blocks_used": kv_blocks_used(response.text),
            "resident_memory_bytes": values.get("process_resident_memory_bytes"),
            "in_flight": values.get("chorus_requests_in_flight", 0.0), "ready": ready, "ready_reason": reason,
            "pauses": server_pauses(response.text)}


def _ready_reason(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("reason"))
    except ValueError:
        return answer.text[:200]


async def _timeline(client: httpx.AsyncClient, begin: float, interval_s: float, stop: asyncio.Event,
                    samples: list[dict]) -> None:
    while not stop.is_set():
        sample = await _sample(client, begin)
        if sample is not None:
            samples.append(sample)
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass


async def _after_drain(client: httpx.AsyncClient, begin: float, interval_s: float, timeout_s: float) -> dict | None:
    """The first sample with nothing in flight (the server's own bookkeeping may trail the
    clients' last bytes by a moment), or the last one taken within ``timeout_s``."""
    give_up = time.perf_counter() + timeout_s
    sample = None
    while True:
        sample = await _sample(client, begin) or sample
        if (sample is not None and sample["in_flight"] == 0) or time.perf_counter() >= give_up:
            return sample
        await asyncio.sleep(interval_s)


def summarize(outcomes: list[Outcome], rate: float, wall_s: float, fmt: str, timeline: list[dict],
              before: dict | None = None, after: dict | None = None, client_lag: list[float] = ()) -> dict:
    """The overload section of the report (``before``/``after``: the samples taken before the
    first request and after the drain; ``client_lag``: the client's own event-loop lag samples)."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    ok = [o for o in outcomes if o.status == "ok"]
    refused = [o for o in outcomes if o.status in REFUSALS]
    latency = [o.e2e_s for o in refused if o.e2e_s is not None]
    codes: dict[str, int] = {}
    for o in refused:
        codes[o.code or f"http_{o.http_status}"] = codes.get(o.code or f"http_{o.http_status}", 0) + 1
    audio = sum(o.audio_s or 0.0 for o in ok) if fmt in MEASURED_FORMATS else None
    ttfa = [o.ttfa_s for o in ok if o.ttfa_s is not None]
    late = [o.late_s for o in outcomes if o.late_s is not None]
    memory = [s["resident_memory_bytes"] for s in timeline if s["resident_memory_bytes"] is not None]
    rss_before = before and before["resident_memory_bytes"]
    rss_after = after and after["resident_memory_bytes"]
    return {
        "arrival_rate": round(rate, 4), "sent": len(outcomes), "wall_s": round(wall_s, 3), "status": counts,
        "completed": len(ok),
        "goodput_requests_per_s": round(len(ok) / wall_s, 4) if wall_s > 0 else None,
        "goodput_audio_s_per_s": round(audio / wall_s, 3) if audio is not None and wall_s > 0 else None,
        "completed_audio_s": None if audio is None else round(audio, 3),
        "ttfa_s": {"p50": _pct(ttfa, 50), "p99": _pct(ttfa, 99), "max": _pct(ttfa, 100)},
        # how late the client sent the requests against their arrival times: the client's own lag
        "send_lag_s": {"p50": _pct(late, 50), "p99": _pct(late, 99), "max": _pct(late, 100)},
        "rejections": {
            "count": len(refused), "codes": codes,
            "latency_s": {"p50": _pct(latency, 50), "p99": _pct(latency, 99), "max": _pct(latency, 100)},
            "with_retry_after": round(sum(1 for o in refused if o.retry_after_s is not None) / len(refused), 4)
            if refused else None,
        },
        # admitted, then not delivered whole: a 504 (deadline before the first byte) or a cut stream
        "deadline_misses_after_admission": {"504": counts.get("504", 0), "cut": counts.get("cut", 0)},
        "client_errors": counts.get("client_error", 0) + counts.get("other", 0),
        "kv_blocks_used_max": max((s["kv_blocks_used"] for s in timeline), default=None),
        "resident_memory_bytes_max": max(memory, default=None),
        # /ready answered something other than 200 (or nothing) at these samples, and why
        "ready_not_200": sum(1 for s in timeline if s["ready"] != 200),
        "ready_not_200_reasons": [f"{s['t_s']} s: {s['ready_reason']}" for s in timeline if s["ready"] != 200],
        "before": before, "after_drain": after,
        "kv_blocks_used_after_drain": after and after["kv_blocks_used"],
        "resident_memory_growth": round(rss_after / rss_before - 1.0, 4) if rss_before and rss_after else None,
        # where a short answer's wait can come from besides the server's work: its event loop's
        # lag and its full garbage collections over the run, and the client's own loop's lag
        "server_pauses": pause_report(before and before.get("pauses"), after and after.get("pauses")),
        "client_loop_lag_s": lag_summary(client_lag),
        "timeline": timeline,
    }


async def _arrive(client, cfg: OnlineBenchConfig, body: dict, due: float) -> Outcome:
    """One arrival: its request, sent now, and how late that is against ``due`` (``perf_counter``)."""
    late = max(0.0, time.perf_counter() - due)
    outcome = await speak_once(client, cfg, body)
    outcome.late_s = late
    return outcome


async def send_arrivals(cfg: OnlineBenchConfig, body: dict, times: list[float],
                        begin: float) -> tuple[list[Outcome], list[float]]:
    """Send one request at ``begin`` (this process's ``time.perf_counter()``) plus each of
    ``times``, read every answer; the outcomes in ``times``' order and this event loop's lag samples."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)  # open loop: no client queue
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0), pool=None)
    client_lag: list[float] = []
    async with speech_client(cfg, 64, limits, timeout) as client:
        lag_watch = asyncio.create_task(watch_loop_lag(client_lag.append))
        tasks = []
        try:
            for at in times:
                delay = begin + at - time.perf_counter()
                # a client behind its schedule still hands the loop over between arrivals: created
                # without a yield, the overdue ones would all open their connections at once and
                # none would get to send its body before the server's body timeout
                await asyncio.sleep(max(delay, 0.0))
                tasks.append(asyncio.create_task(_arrive(client, cfg, body, begin + at)))
            outcomes = list(await asyncio.gather(*tasks))
        finally:
            lag_watch.cancel()
    return outcomes, client_lag


async def run_overload(cfg: OnlineBenchConfig, overload: OverloadConfig, body: dict, rate: float) -> dict:
    """Send requests at ``rate`` (Poisson; from ``cfg.client_processes`` processes, arrival i from
    process i mod N), read every answer, poll /metrics; the overload report."""
    times = arrival_times(rate, overload.requests, overload.duration_s, overload.seed)
    processes = cfg.client_processes
    senders = None
    if processes > 1:
        senders = ClientProcesses("overload", send_arrivals, [(cfg, body, times[k::processes]) for k in range(processes)])
    timeline: list[dict] = []
    try:
        if senders is not None:
            await asyncio.get_running_loop().run_in_executor(None, senders.start)
        async with httpx.AsyncClient(base_url=cfg.url, headers=auth_headers(cfg.api_key), timeout=10.0) as scraper:
            stop = asyncio.Event()
            begin = time.perf_counter()
            before = await _sample(scraper, begin)
            poller = asyncio.create_task(_timeline(scraper, begin, cfg.metrics_interval_s, stop, timeline))
            try:
                if senders is None:
                    outcomes, client_lag = await send_arrivals(cfg, body, times, begin)
                    sent_by = [sender_summary(os.getpid(), outcomes, client_lag)]
                else:
                    shards, client_lag, sent_by = await senders.run(begin)
                    outcomes = [shards[i % processes][i // processes] for i in range(sum(map(len, shards)))]
            finally:
                wall = time.perf_counter() - begin
                stop.set()
                await poller
            after = await _after_drain(scraper, begin, cfg.metrics_interval_s, timeout_s=30.0)
    finally:
        if senders is not None:
            senders.close()
    report = summarize(outcomes, rate, wall, cfg.response_format, timeline, before, after, client_lag)
    report["client_processes"] = processes
    report["client_senders"] = sent_by
    return report
