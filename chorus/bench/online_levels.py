"""``chorus bench online``'s closed-loop levels: a load test of a running ``chorus serve``, over HTTP
(or, with ``--protocol grpc``, its Riva gRPC door: grpc_speech.py).

Per concurrency level N, N clients (asyncio tasks sharing one httpx connection pool of N
connections; with ``client_processes`` P, split between P processes, each with its own pool and
event loop) send ``POST /v1/audio/speech`` back to back, each reading its response as a stream,
until the level's request budget is spent (``requests_per_level``) or its time is up
(``duration_s``; requests in flight then are finished and counted). Per request: its status, time
to the first audio byte, end-to-end time, the audio received, the real-time factor and whether a
player starting at the first byte would have run dry. Per level: counts by status, percentiles,
throughput, and what the server's ``/metrics`` said (counter deltas over the level, gauge peaks
polled during it). Rejections (429, 503, 504) are counted as data, never raised (online_bench.py).
docs/benchmarks.md ("Online load test") explains every field.
"""
from __future__ import annotations

import asyncio
import time

import httpx

from chorus.bench.client_processes import ClientProcesses, lag_summary
from chorus.bench.online_bench import (FAILURES, MEASURED_FORMATS, REJECTIONS, STATUSES, OnlineBenchConfig, Outcome,
                                       _pct, auth_headers, speak_once)
from chorus.bench.server_metrics import HISTOGRAMS, MetricsWatch
from chorus.bench.speech_client import speech_client
from chorus.loop_lag import watch_loop_lag


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
        out[version] = {"ok": len(mine),
                        "ttfa_s": {"p50": _pct(ttfa, 50), "p95": _pct(ttfa, 95), "p99": _pct(ttfa, 99)},
                        "e2e_s": {"p50": _pct(e2e, 50), "p99": _pct(e2e, 99)}}
    return out

async def run_clients(cfg: OnlineBenchConfig, body: dict, starts: list[float], budget: int | None,
                      begin: float) -> tuple[list[Outcome], list[float]]:
    """Closed-loop clients on this process's event loop, client i from ``starts[i]`` seconds after
    ``begin`` (this process's ``time.perf_counter()``): each sends a request, reads its answer,
    and sends the next, until ``budget`` requests were sent by them all (None: until
    ``cfg.duration_s`` after ``begin``). Their outcomes and this loop's lag samples
    (``chorus.loop_lag``)."""
    clients = len(starts)
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

    async with speech_client(cfg, clients, limits, timeout) as client:
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
