"""``chorus bench online --agent``: voice agents over the WebSocket of a running ``chorus serve``.

Per level N, N WebSocket connections (``WS /v1/audio/speech/stream``) behave like voice agents.
Each sends its ``config``, then speaks ``turns`` turns one after the other: a turn streams the
reply text as LLM-like token deltas (:func:`llm_tokens`) at ``llm_tokens_per_s`` (fixed or
Poisson spacing, seeded), then ``flush``, and ends at its ``done`` (or ``cancelled``, or an
error); the next turn starts ``turn_gap_s`` later (with ``turn_gap_max_s``, a gap drawn from
between the two, as a user's answers differ in length), or with ``listen`` that long after the
turn's audio has played at 1x from its first frame (a barged-in turn stops playing at its
``cancel``), as an agent waits for its user to hear the reply and answer. A
``cancel_fraction`` of the turns (picked by the seed) is barged in: ``cancel`` goes out as soon
as the turn's first audio frame arrives, and no more of its text is sent. After its last turn a
connection sends ``close`` and reads until the server closes it, so any frame that follows a
turn's end is seen.

Per turn: time from its first text delta to its first audio frame, the part the server added
(that minus the ``threshold_wait_s`` its ``done`` reports), ``flush`` to the last audio frame,
playback stalls once its audio started (online_bench's :class:`Playback`), and for a barge-in
``cancel`` -> ``cancelled`` and any frame after it. docs/benchmarks.md ("Voice-agent latency")
explains every field. Only the client lives here (websockets, httpx, numpy; no model): the
agents' config, their text and how they talk here, a connection's turns as the client sees them in
ws_turn.py, a level's report in ws_report.py.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import random
import re
import time
from dataclasses import dataclass, field

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from chorus.bench.online_bench import OnlineBenchError, auth_headers, check_load, first_model
from chorus.bench.server_metrics import COUNTERS, GAUGES, MetricsWatch
from chorus.bench.ws_report import progress_line, summarize
from chorus.bench.ws_turn import SAMPLE_BYTES, ConnectionLog, Turn

WS_PATH = "/v1/audio/speech/stream"
FORMATS = ("pcm", "pcm_24000", "pcm_16000", "pcm_8000", "mulaw_8000", "mp3", "opus")
SPACINGS = ("fixed", "poisson")
CHUNKING_KEYS = ("min_chars", "max_chars", "max_wait_ms")
DEFAULT_TURNS = 4
# An agent's reply: a short opening sentence (the first piece a threshold can cut early), a long
# one with a clause, a question; 152 characters, 35 tokens, about 10 s of speech.
AGENT_TEXT = ("Sure, I can help with that. Your order left our warehouse this morning, and it should arrive "
              "on Thursday. Is there anything else I can do for you today?")
SUBWORD_CHARS = 8  # a longer word is sent as pieces of SUBWORD_PIECE characters
SUBWORD_PIECE = 5
COUNTERS_WS = {**COUNTERS, "ws_turns": "chorus_ws_turns_total"}
GAUGES_WS = {**GAUGES, "ws_connections_open_max": "chorus_ws_connections_open"}


@dataclass
class AgentBenchConfig:
    url: str
    api_key: str | None = None
    model: str | None = None  # None: the first id of GET /v1/models
    voice: str = "default"
    concurrency: tuple[int, ...] = (1, 16, 64, 256)  # connections per level
    turns: int = DEFAULT_TURNS  # per connection
    text: str = AGENT_TEXT  # every turn's reply
    llm_tokens_per_s: float = 50.0
    token_spacing: str = "fixed"
    cancel_fraction: float = 0.0
    turn_gap_s: float = 0.0
    turn_gap_max_s: float | None = None  # each gap uniform within [turn_gap_s, this] (None: turn_gap_s)
    ramp_s: float = 0.0  # connection i starts its first turn i/N of this later (0: all within one token interval)
    listen: bool = False  # the next turn waits until this one's audio has played (then turn_gap_s)
    seed: int = 0  # token spacing, connection phases, which turns are cancelled
    response_format: str = "pcm"
    max_new_tokens: int | None = None
    chunking: dict | None = None  # the connection's text threshold (None: the server's)
    warmup: int = 1  # turns on one connection before the first level, not counted
    timeout_s: float = 300.0  # per turn, from its first delta to its end
    metrics_interval_s: float = 0.5
    settle_s: float = 0.5
    extra_config: dict = field(default_factory=dict)  # more config fields (seed, priority, ...)

    def __post_init__(self):
        self.url, self.concurrency = check_load(self.url, self.concurrency, self.text, self.max_new_tokens)
        if self.turns < 1 or self.warmup < 0:
            raise ValueError(f"--turns must be >= 1 and --warmup >= 0, got {self.turns} and {self.warmup}")
        if not self.llm_tokens_per_s > 0:
            raise ValueError(f"--llm-tokens-per-s must be > 0, got {self.llm_tokens_per_s}")
        if self.token_spacing not in SPACINGS:
            raise ValueError(f"--token-spacing must be one of {', '.join(SPACINGS)}, got {self.token_spacing!r}")
        if not 0.0 <= self.cancel_fraction <= 1.0:
            raise ValueError(f"--cancel-fraction must be within [0, 1], got {self.cancel_fraction}")
        if self.turn_gap_s < 0 or not self.timeout_s > 0:
            raise ValueError("--turn-gap-s must be >= 0 and --timeout-s > 0")
        if self.turn_gap_max_s is not None and not self.turn_gap_max_s >= self.turn_gap_s:
            raise ValueError(f"--turn-gap-max-s must be >= --turn-gap-s ({self.turn_gap_s:g}), "
                             f"got {self.turn_gap_max_s}")
        if not self.ramp_s >= 0:
            raise ValueError(f"--ramp-s must be a number >= 0, got {self.ramp_s}")
        if self.response_format not in FORMATS:
            raise ValueError(f"--response-format with --agent must be one of {', '.join(FORMATS)}, "
                             f"got {self.response_format!r}")
        unknown = set(self.chunking or {}) - set(CHUNKING_KEYS)
        if unknown:
            raise ValueError(f"--chunking takes {', '.join(CHUNKING_KEYS)}; got {', '.join(sorted(unknown))}")

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[len("http"):] + WS_PATH

    def config_message(self, model: str) -> dict:
        message = {"type": "config", "model": model, "voice": self.voice, "response_format": self.response_format,
                   **self.extra_config}
        if self.max_new_tokens is not None:
            message["max_new_tokens"] = self.max_new_tokens
        if self.chunking:
            message["chunking"] = dict(self.chunking)
        return message


# ---------------------------------------------------------------------------------- the agent's text

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")


def llm_tokens(text: str) -> list[str]:
    """The text as an LLM streams it: a word with the whitespace before it, each punctuation
    mark on its own, and a word longer than SUBWORD_CHARS in pieces of SUBWORD_PIECE characters
    (about 1.2 tokens a word in English prose). The tokens concatenate to the text."""
    tokens = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        word = token.lstrip()
        if len(word) <= SUBWORD_CHARS:
            tokens.append(token)
            continue
        pieces = [word[i:i + SUBWORD_PIECE] for i in range(0, len(word), SUBWORD_PIECE)]
        tokens.append(token[:len(token) - len(word)] + pieces[0])
        tokens.extend(pieces[1:])
    assert "".join(tokens) == text, "the tokens must cover the text"
    return tokens


def token_times(count: int, rate: float, spacing: str, rng: random.Random) -> list[float]:
    """When each of a turn's ``count`` deltas is due, in seconds from the turn's start: the
    first at 0, then 1/rate apart (fixed) or after exponential gaps of mean 1/rate (poisson)."""
    times, now = [], 0.0
    for k in range(count):
        if k:
            now += 1.0 / rate if spacing == "fixed" else rng.expovariate(rate)
        times.append(now)
    return times


# ---------------------------------------------------------------------------------- one agent

class ConfigRefused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


async def _open(cfg: AgentBenchConfig, model: str, log: ConnectionLog) -> ClientConnection | None:
    """Handshake, ``config``, ``ready``; None (and the reason in ``log``) when refused."""
    headers = auth_headers(cfg.api_key)
    try:
        # no compression (audio does not compress, and it costs both ends CPU), no proxy from the
        # environment, no keepalive pings (a loaded server must not be dropped for a late pong)
        ws = await connect(cfg.ws_url, additional_headers=headers, compression=None, proxy=None, max_size=None,
                           ping_interval=None, open_timeout=min(cfg.timeout_s, 30.0))
    except InvalidStatus as exc:
        log.error(f"http_{exc.response.status_code}", (exc.response.body or b"")[:200].decode("utf-8", "replace"))
        return None
    except (OSError, asyncio.TimeoutError, WebSocketException) as exc:
        log.error("connect_failed", f"{type(exc).__name__}: {exc}")
        return None
    try:
        await ws.send(json.dumps(cfg.config_message(model)))
        answer = json.loads(await asyncio.wait_for(ws.recv(), cfg.timeout_s))
        if answer.get("type") != "ready":
            raise ConfigRefused(str(answer.get("code")), str(answer.get("message", answer)))
        log.ready = answer
        return ws
    except ConfigRefused as exc:
        log.error(exc.code, exc.message)
    except ConnectionClosed as exc:  # e.g. 1013 at the server's connection limit
        log.error(f"close_{exc.rcvd.code}" if exc.rcvd else "config_failed", f"closed before ready: {exc}")
    except (asyncio.TimeoutError, ValueError, TypeError, AttributeError) as exc:
        log.error("config_failed", f"no ready answer: {type(exc).__name__}: {exc}")
    await ws.close()
    log.closed(time.perf_counter(), ws.close_code)
    return None


async def _read(ws: ClientConnection, log: ConnectionLog) -> None:
    try:
        async for message in ws:
            now = time.perf_counter()
            if isinstance(message, bytes):
                log.on_frame(now, message)
            else:
                log.on_event(now, message)
    except ConnectionClosed:
        pass  # an abnormal close: its code is kept below
    finally:
        log.closed(time.perf_counter(), ws.close_code)


async def _send(ws: ClientConnection, **message) -> float:
    stamp = time.perf_counter()
    await ws.send(json.dumps(message))
    return stamp


async def _cancel_at_first_audio(ws: ClientConnection, turn: Turn, until: float | None) -> bool:
    """Wait for the turn's first audio (or its end) until ``until`` (None: as long as it takes);
    True when it came and ``cancel`` was sent."""
    try:
        await asyncio.wait_for(turn.wake.wait(), None if until is None else max(0.0, until - time.perf_counter()))
    except asyncio.TimeoutError:
        return False
    if turn.outcome is not None:
        return False
    turn.cancel_sent = await _send(ws, type="cancel", turn_id=turn.turn_id)
    return True


async def _speak(ws: ClientConnection, cfg: AgentBenchConfig, turn: Turn, tokens: list[str], times: list[float]):
    """Send the turn's deltas on their schedule and its flush (or its cancel at the first audio,
    after which the agent's LLM stops too), then wait for its end."""
    start = time.perf_counter()
    for token, at in zip(tokens, times):
        due = start + at
        if turn.cancel_planned and turn.cancel_sent is None:
            if await _cancel_at_first_audio(ws, turn, due):
                break
        elif due > time.perf_counter():
            await asyncio.sleep(due - time.perf_counter())
        if turn.outcome is not None:  # an error ended it
            break
        turn.send_lag_s = max(turn.send_lag_s, time.perf_counter() - due)
        stamp = await _send(ws, type="text", turn_id=turn.turn_id, text=token)
        turn.first_delta = turn.first_delta or stamp
    else:
        turn.flushed = await _send(ws, type="flush", turn_id=turn.turn_id)
        if turn.cancel_planned and turn.cancel_sent is None:
            await _cancel_at_first_audio(ws, turn, None)
    await turn.ended.wait()


def turn_gap(cfg: AgentBenchConfig, rng: random.Random) -> float:
    """Seconds between a turn's end (with ``listen``: its audio's end) and the next turn's start:
    ``turn_gap_s``, or with ``turn_gap_max_s`` a draw from the connection's seeded ``rng``,
    uniform between the two."""
    if cfg.turn_gap_max_s is None:
        return cfg.turn_gap_s
    return rng.uniform(cfg.turn_gap_s, cfg.turn_gap_max_s)


def _left_to_play(cfg: AgentBenchConfig, turn: Turn) -> float:
    """With ``listen``: seconds until the player has played ``turn``'s audio to its end (0 for a
    barged-in turn, whose playing stopped at its ``cancel``, and for one without measured audio)."""
    playback = turn.playback
    if not cfg.listen or turn.cancel_sent is not None or playback.first is None:
        return 0.0
    return playback.first + playback.audio_s + playback.stall_s - time.perf_counter()


async def run_connection(cfg: AgentBenchConfig, model: str, log: ConnectionLog, rng: random.Random,
                         turns: int, name: str, phase_s: float = 0.0, cancels: bool = True) -> None:
    """One agent: open, ``turns`` turns one after the other, ``close``, read to the server's close."""
    ws = await _open(cfg, model, log)
    if ws is None:
        return
    sample_bytes = SAMPLE_BYTES.get(cfg.response_format)
    rate = int(log.ready.get("sample_rate") or 24_000)
    tokens = llm_tokens(cfg.text)
    reader = asyncio.create_task(_read(ws, log))
    try:
        await asyncio.sleep(phase_s)
        for k in range(turns):
            if k:
                await asyncio.sleep(turn_gap(cfg, rng) + max(0.0, _left_to_play(cfg, log.turns[-1])))
            if reader.done():
                return
            turn = Turn(f"{name}-t{k}", k, cancel_planned=cancels and rng.random() < cfg.cancel_fraction,
                        sample_bytes=sample_bytes, rate=rate)
            log.turns.append(turn)
            times = token_times(len(tokens), cfg.llm_tokens_per_s, cfg.token_spacing, rng)
            try:
                await asyncio.wait_for(_speak(ws, cfg, turn, tokens, times), cfg.timeout_s)
            except asyncio.TimeoutError:
                turn.end(time.perf_counter(), "lost", "timeout", f"no end within --timeout-s {cfg.timeout_s:g} s")
                return
        await _send(ws, type="close")
        await asyncio.wait_for(asyncio.shield(reader), min(cfg.timeout_s, 30.0))
    except ConnectionClosed:
        pass  # the reader saw it and ended the open turn
    except asyncio.TimeoutError:
        log.error("close_timeout", "the server did not close the connection after close")
    finally:
        await ws.close()
        await reader


# ---------------------------------------------------------------------------------- a level

def first_turn_phase(cfg: AgentBenchConfig, i: int, concurrency: int, rng: random.Random) -> float:
    """When connection ``i`` of ``concurrency`` starts its first turn, in seconds from the level's
    start: its place in the ramp (``i / concurrency`` of ``ramp_s``) plus a random phase within one
    token interval, so N agents at a fixed rate do not send in lockstep."""
    return cfg.ramp_s * i / concurrency + rng.uniform(0.0, 1.0 / cfg.llm_tokens_per_s)


async def run_level(cfg: AgentBenchConfig, model: str, concurrency: int) -> tuple[dict, dict | None]:
    """N agents at once (see the module docstring): the level's report and a ``ready`` event."""
    headers = auth_headers(cfg.api_key)
    logs = [ConnectionLog() for _ in range(concurrency)]
    rngs = [random.Random(f"{cfg.seed}/{concurrency}/{i}") for i in range(concurrency)]
    async with httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=10.0) as scraper:
        watch = MetricsWatch(scraper, COUNTERS_WS, GAUGES_WS)
        async with watch.level(cfg.metrics_interval_s, cfg.settle_s) as clock:
            await asyncio.gather(*(run_connection(cfg, model, log, rng, cfg.turns, f"n{concurrency}c{i}",
                                                  first_turn_phase(cfg, i, concurrency, rng))
                                   for i, (log, rng) in enumerate(zip(logs, rngs))))
    level = summarize(concurrency, cfg.turns, logs, clock.wall_s, cfg.response_format)
    level["server"] = watch.report(clock.wall_s)
    return level, next((log.ready for log in logs if log.ready is not None), None)


# ---------------------------------------------------------------------------------- the run

async def _warm_up(cfg: AgentBenchConfig, model: str) -> tuple[dict, dict | None]:
    """``cfg.warmup`` turns on one connection. A refused handshake or config would refuse every
    connection, so it stops the run."""
    log = ConnectionLog()
    if cfg.warmup:
        await run_connection(cfg, model, log, random.Random(cfg.seed), cfg.warmup, "warmup", cancels=False)
    if log.ready is None and log.last_error is not None:
        code, sample = log.last_error, log.samples[0] if log.samples else log.last_error
        if code == "connect_failed":
            raise OnlineBenchError(f"cannot open a WebSocket to {cfg.ws_url}: {sample}")
        if code.startswith("http_"):
            raise OnlineBenchError(f"the server refused the WebSocket handshake at {cfg.ws_url} ({sample[5:]}); a "
                                   "401 wants --api-key; a 403 or 404 may be a server without the voice-agent endpoint")
        raise OnlineBenchError(f"the server refused the connection's config ({sample})")
    return {"turns": len(log.turns), "done": sum(1 for t in log.turns if t.outcome == "done")}, log.ready


async def run_agent_async(cfg: AgentBenchConfig, progress=None) -> dict:
    model = cfg.model
    if model is None:
        headers = auth_headers(cfg.api_key)
        async with httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=30.0) as client:
            model = await first_model(cfg.url, client)
    tokens = llm_tokens(cfg.text)
    report = {
        "benchmark": "online-agent", "url": cfg.url, "ws_url": cfg.ws_url, "model": model, "voice": cfg.voice,
        "response_format": cfg.response_format, "audio_measured": cfg.response_format in SAMPLE_BYTES,
        "text_chars": len(cfg.text), "text_words": len(cfg.text.split()), "tokens_per_turn": len(tokens),
        "llm_tokens_per_s": cfg.llm_tokens_per_s, "token_spacing": cfg.token_spacing, "seed": cfg.seed,
        "turns_per_connection": cfg.turns, "turn_gap_s": cfg.turn_gap_s,
        "turn_gap_max_s": cfg.turn_gap_max_s, "ramp_s": cfg.ramp_s, "listen": cfg.listen,
        "cancel_fraction": cfg.cancel_fraction,
        "max_new_tokens": cfg.max_new_tokens, "chunking_requested": cfg.chunking,
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    report["warmup"], ready = await _warm_up(cfg, model)
    report["ready"] = ready
    report["levels"] = []
    for n in cfg.concurrency:
        level, ready = await run_level(cfg, model, n)
        report["ready"] = report["ready"] or ready
        report["levels"].append(level)
        if progress is not None:
            progress(level)
    return report


def run_agent(cfg: AgentBenchConfig, *, progress: bool = False) -> dict:
    """Run every level and return the report (a JSON-ready dict)."""
    return asyncio.run(run_agent_async(cfg, progress_line if progress else None))
