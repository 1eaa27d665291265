"""``chorus bench online`` over HTTP: the load test's configs (:class:`OnlineBenchConfig` for the
closed-loop levels, :class:`OverloadConfig` for the open-loop run) and one request as a client
sees it (:func:`speak_once`): its status, time to the first audio byte, end-to-end time, the audio
received and whether a player starting at the first byte would have run dry (:class:`Playback`).

The server is admission-controlled: 429 (queue full), 503 (memory pressure) and 504 (deadline)
answers are data about the server under load, counted in the report, never raised.

Only the client lives here (httpx and numpy; no model, no torch), so it runs from any machine
that reaches the server. The closed-loop levels are online_levels.py, the open-loop overload run
overload_bench.py, the processes that send them client_processes.py, the /metrics scrapes
server_metrics.py; the run that strings them together is online_run.py. docs/benchmarks.md
("Online load test") explains every field.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass, field

import httpx
import numpy as np

SAMPLE_RATE = 24_000  # the server's output rate; pcm is 16-bit little-endian mono
WAV_HEADER_BYTES = 44  # the streamed wav header (open-ended sizes), then pcm
MEASURED_FORMATS = ("pcm", "wav")  # audio seconds are counted from the bytes of these
CLIENT_LATE_WARNING_S = 0.1  # open loop: requests sent this much later than due (p99) warn of a busy client
RESPONSE_FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")
PROTOCOLS = ("http", "grpc")
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
    protocol: str = "http"  # "grpc": the requests go to the Riva gRPC door at grpc_target (grpc_speech.py)
    grpc_target: str | None = None  # host:port of the server's --grpc-port
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
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.protocol == "grpc":
            if not re.match(r"^[^/\s]+:\d+$", self.grpc_target or ""):
                raise ValueError(f"--protocol grpc needs --grpc-target HOST:PORT (the server's --grpc-port), "
                                 f"got {self.grpc_target!r}")
            if self.response_format != "pcm":
                raise ValueError("--protocol grpc measures LINEAR_PCM at 24 kHz: leave --response-format pcm")
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
    grpc_status: str | None = None  # --protocol grpc: the status of a call that failed (RESOURCE_EXHAUSTED, ...)


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


async def speak_once(client, cfg: OnlineBenchConfig, body: dict) -> Outcome:
    """Send one speech request through ``client`` (``speech_client.speech_client``) and read its
    response to the end, within ``cfg.timeout_s`` in all."""
    start = time.perf_counter()
    outcome = Outcome(status="client_error")  # until an answer comes
    playback = Playback()
    exchange = client.speak(body, outcome, playback, start) if cfg.protocol == "grpc" \
        else _exchange(client, cfg, body, outcome, playback, start)
    try:
        await asyncio.wait_for(exchange, cfg.timeout_s)
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


# ---------------------------------------------------------------------------------- shared by the runs

def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def auth_headers(key: str | None) -> dict[str, str]:
    """The ``Authorization`` header that carries an API key (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


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
