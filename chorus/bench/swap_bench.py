"""``chorus bench swap``: a hot swap under load (docs/models.md, docs/benchmarks.md "Swap under load").

N clients send speech requests to one model back to back (closed loop, one connection each, every
response read as a stream, as ``chorus bench online`` does). After ``before_s`` the bench asks
the admin API to load a new version of the model (``POST /v1/admin/models/{id}/load`` without a
weight: a swap) and keeps the load on until ``after_s`` after the swap answered. Each request is
filed by when it was sent: ``before`` the swap call, ``during`` it (the new version loading and
warming beside the old one, then the route moving) or ``after`` it (the old version retiring
while its streams finish). The report gives, per phase, the outcomes, time to first audio and
the versions that served, and over the whole run the requests refused at once (429: admission,
a matter of load), and those that failed (any other non-200 answer, a 503 or 504 included) or
were cut: a swap that keeps its promise has no failed or cut request, and its ``during`` p99 time
to first audio stays close to ``before``'s.
"""
from __future__ import annotations

import asyncio
import datetime
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from chorus.bench.online_bench import (DEFAULT_TEXT, OnlineBenchConfig, OnlineBenchError, Outcome, _pct, auth_headers,
                                       first_model, request_body, speak_once)

PHASES = ("before", "during", "after")


@dataclass
class SwapBenchConfig:
    url: str
    admin_key: str
    version: str  # the label of the version to load
    checkpoint: str | None = None  # None: the model's current checkpoint (a reload)
    api_key: str | None = None
    model: str | None = None  # None: the first id of GET /v1/models
    concurrency: int = 64
    before_s: float = 20.0
    after_s: float = 20.0
    text: str = DEFAULT_TEXT
    response_format: str = "pcm"
    max_new_tokens: int | None = None
    timeout_s: float = 300.0
    swap_timeout_s: float = 600.0  # the admin call: a load, a warm-up and a canary

    def __post_init__(self):
        if not self.admin_key:
            raise ValueError("--admin-key is required: the swap is an admin call")
        if not self.version.strip():
            raise ValueError("--version must name the new version")
        if self.before_s < 0 or self.after_s < 0:
            raise ValueError("--before-s and --after-s must be >= 0")
        self.requests = OnlineBenchConfig(url=self.url, api_key=self.api_key, model=self.model,
                                          concurrency=(self.concurrency,), text=self.text,
                                          response_format=self.response_format, max_new_tokens=self.max_new_tokens,
                                          timeout_s=self.timeout_s, warmup=0)
        self.url = self.requests.url


def _phase_summary(outcomes: list[Outcome]) -> dict:
    ok = [o for o in outcomes if o.status == "ok"]
    ttfa = [o.ttfa_s for o in ok if o.ttfa_s is not None]
    return {"requests": len(outcomes), "ok": len(ok), "status": dict(Counter(o.status for o in outcomes)),
            "ttfa_s": {"p50": _pct(ttfa, 50), "p95": _pct(ttfa, 95), "p99": _pct(ttfa, 99), "max": _pct(ttfa, 100)},
            "versions": dict(Counter(o.version for o in ok if o.version is not None))}


async def run_swap_async(cfg: SwapBenchConfig) -> dict:
    headers = auth_headers(cfg.api_key)
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0), pool=None)
    sent: list[tuple[float, Outcome]] = []
    swap: dict = {}
    async with httpx.AsyncClient(base_url=cfg.url, headers=headers, limits=limits, timeout=timeout) as client, \
            httpx.AsyncClient(base_url=cfg.url, timeout=cfg.swap_timeout_s,
                              headers=auth_headers(cfg.admin_key)) as admin:
        model = cfg.model or await first_model(cfg.url, client)
        body = request_body(cfg.requests, model)
        stop = asyncio.Event()

        async def client_loop() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                sent.append((started, await speak_once(client, cfg.requests, body)))

        begin = time.perf_counter()
        clients = [asyncio.create_task(client_loop()) for _ in range(cfg.concurrency)]
        try:
            await asyncio.sleep(cfg.before_s)
            load = {"version": cfg.version, **({"checkpoint": cfg.checkpoint} if cfg.checkpoint else {})}
            swap["started_s"] = time.perf_counter() - begin
            try:
                answer = await admin.post(f"/v1/admin/models/{model}/load", json=load)
                swap.update(status=answer.status_code, body=answer.json())
            except (httpx.HTTPError, ValueError) as exc:
                swap.update(status=None, error=f"{type(exc).__name__}: {exc}")
            swap["ended_s"] = time.perf_counter() - begin
            await asyncio.sleep(cfg.after_s)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        wall = time.perf_counter() - begin
    if swap.get("status") is None or swap["status"] >= 400:
        raise OnlineBenchError(f"the swap failed: {swap.get('error') or swap.get('body')}")
    phases: dict[str, list[Outcome]] = {p: [] for p in PHASES}
    for started, outcome in sent:
        at = started - begin
        phase = "before" if at < swap["started_s"] else "during" if at < swap["ended_s"] else "after"
        phases[phase].append(outcome)
    report = {
        "benchmark": "swap", "url": cfg.url, "model": model, "version": cfg.version, "checkpoint": cfg.checkpoint,
        "concurrency": cfg.concurrency, "before_s": cfg.before_s, "after_s": cfg.after_s,
        "response_format": cfg.response_format, "max_new_tokens": cfg.max_new_tokens, "wall_s": round(wall, 3),
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "swap": {"seconds": round(swap["ended_s"] - swap["started_s"], 3), "status": swap["status"],
                 "versions": {v["version"]: v["state"] for v in swap["body"].get("versions", [])}},
        "phases": {p: _phase_summary(o) for p, o in phases.items()},
        # refused at once with 429 (admission: load, not the swap) apart; any other answer than
        # 200, a 503 or 504 included, and any stream cut is a request the swap failed
        "refused": sum(1 for _, o in sent if o.status == "429"),
        "failed": sum(1 for _, o in sent if o.status not in ("ok", "429")),
        "cut": sum(1 for _, o in sent if o.status == "cut"),
    }
    before, during = report["phases"]["before"]["ttfa_s"]["p99"], report["phases"]["during"]["ttfa_s"]["p99"]
    report["ttfa_p99_during_over_before"] = round(during / before, 3) if before and during else None
    return report


def run_swap(cfg: SwapBenchConfig) -> dict:
    return asyncio.run(run_swap_async(cfg))
