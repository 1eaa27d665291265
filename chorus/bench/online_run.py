"""``chorus bench online``'s run: a warm-up, the closed-loop levels (online_levels.py), then, when
asked, the open-loop overload run (overload_bench.py) at a rate of its own or at a multiple of the
capacity the levels measured; one report of it all. docs/benchmarks.md ("Online load test",
"Overload mode") explains every field.
"""
from __future__ import annotations

import asyncio
import datetime
import sys

import httpx

from chorus.bench.grpc_speech import REFUSED
from chorus.bench.online_bench import (CLIENT_LATE_WARNING_S, MEASURED_FORMATS, SAMPLE_RATE, OnlineBenchConfig,
                                       OnlineBenchError, auth_headers, first_model, request_body, speak_once)
from chorus.bench.online_levels import run_level
from chorus.bench.overload_bench import capacity_of, realtime_capacity_of, run_overload
from chorus.bench.speech_client import speech_client


async def _warm_up(cfg: OnlineBenchConfig, body: dict) -> dict:
    """``cfg.warmup`` requests one at a time. A refusal that is not about load (a bad model,
    voice or field: 4xx other than 429) would fail every request, so it stops the run."""
    outcomes = []
    async with speech_client(cfg, 1, httpx.Limits(), httpx.Timeout(cfg.timeout_s)) as client:
        for _ in range(cfg.warmup):
            outcome = await speak_once(client, cfg, body)
            outcomes.append(outcome)
            if outcome.status == "client_error":
                where = cfg.grpc_target if cfg.protocol == "grpc" else cfg.url
                raise OnlineBenchError(f"cannot reach the server at {where}: {outcome.message}")
            if outcome.status == "other" and (outcome.grpc_status in REFUSED or (
                    outcome.http_status is not None and 400 <= outcome.http_status < 500)):
                answer = outcome.http_status or outcome.grpc_status
                raise OnlineBenchError(f"the server refused the benchmark request ({answer} "
                                       f"{outcome.code}): {outcome.message}")
    return {"requests": len(outcomes), "ok": sum(1 for o in outcomes if o.status == "ok")}


async def run_async(cfg: OnlineBenchConfig, progress=None) -> dict:
    headers = auth_headers(cfg.api_key)
    model = cfg.model
    if model is None:
        async with httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=30.0) as client:
            model = await first_model(cfg.url, client)
    body = request_body(cfg, model)
    report = {
        "benchmark": "online", "url": cfg.url, "protocol": cfg.protocol, "grpc_target": cfg.grpc_target,
        "model": model, "voice": cfg.voice,
        "response_format": cfg.response_format,
        "audio_measured": cfg.response_format in MEASURED_FORMATS, "sample_rate": SAMPLE_RATE,
        "text_chars": len(cfg.text), "text_words": len(cfg.text.split()), "max_new_tokens": cfg.max_new_tokens,
        "requests_per_level": cfg.requests_per_level, "duration_s": cfg.duration_s,
        "honor_retry_after": cfg.honor_retry_after, "ramp_s": cfg.ramp_s,
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    report["warmup"] = await _warm_up(cfg, body)
    report["levels"] = []
    overload = cfg.overload
    if overload is None or overload.arrival_rate is None:  # closed loop (also measures capacity for a multiple)
        for n in cfg.concurrency:
            level = await run_level(cfg, body, n)
            report["levels"].append(level)
            if progress is not None:
                progress(level)
    if overload is not None:
        rate = overload.arrival_rate
        if rate is None:
            capacity = capacity_of(report["levels"])
            if capacity <= 0:
                raise OnlineBenchError("the closed-loop levels completed no request, so there is no capacity "
                                       "to multiply; pass --arrival-rate instead")
            rate = overload.overload_multiple * capacity
            report["capacity_requests_per_s"] = round(capacity, 4)
            realtime = realtime_capacity_of(report["levels"])
            report["capacity_realtime_requests_per_s"] = None if realtime is None else round(realtime, 4)
        report["overload"] = await run_overload(cfg, overload, body, rate)
        if overload.arrival_rate is None:
            goodput = report["overload"]["goodput_requests_per_s"]
            report["overload"]["goodput_fraction_of_capacity"] = round(goodput / capacity, 4)
            report["overload"]["goodput_fraction_of_realtime_capacity"] = \
                None if realtime is None else round(goodput / realtime, 4)
        if progress is not None:
            _overload_line(report["overload"])
    return report


def _overload_line(result: dict) -> None:
    rejections = result["rejections"]
    p99 = rejections["latency_s"]["p99"]
    misses = result["deadline_misses_after_admission"]
    print(f"overload at {result['arrival_rate']:g} req/s: {result['completed']}/{result['sent']} completed, "
          f"goodput {result['goodput_audio_s_per_s']} audio s/s, {rejections['count']} refused (p99 "
          f"{'-' if p99 is None else f'{1000 * p99:.0f} ms'}), {misses['504']} 504 and {misses['cut']} cut "
          f"after admission; /ready not 200 at {result['ready_not_200']} samples; KV blocks after the drain "
          f"{result['kv_blocks_used_after_drain']}; {result['wall_s']:.1f} s", file=sys.stderr)
    late = result["send_lag_s"]["p99"]
    if late is not None and late > CLIENT_LATE_WARNING_S:
        print(f"warning: the client sent its requests late (p99 {1000 * late:.0f} ms after their arrival "
              f"times), so it measured itself as well as the server; send from more processes "
              f"(--overload-client-processes)", file=sys.stderr)


def _progress_line(level: dict) -> None:
    ttfa = level["ttfa_s"]["p50"]
    shown = "-" if ttfa is None else f"{1000 * ttfa:.0f} ms"
    print(f"concurrency {level['concurrency']}: {level['ok']}/{level['requests']} ok, {level['rejected']} rejected, "
          f"{level['failed']} failed; TTFA p50 {shown}; {level['wall_s']:.1f} s", file=sys.stderr)


def run_online(cfg: OnlineBenchConfig, *, progress: bool = False) -> dict:
    """Run every level and return the report (a JSON-ready dict)."""
    return asyncio.run(run_async(cfg, _progress_line if progress else None))
