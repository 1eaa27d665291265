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
explains every field. Only the client lives here (websockets, httpx, numpy; no model).
"""
from __future__ import annotations

import asyncio
import datetime
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from chorus.bench.online_bench import (COUNTERS, GAUGES, MetricsWatch, OnlineBenchError, Playback, _pct,
                                       auth_headers, check_load, first_model)
from chorus.integrations.ws_client import ProtocolError, parse_audio_frame

WS_PATH = "/v1/audio/speech/stream"
FORMATS = ("pcm", "pcm_24000", "pcm_16000", "pcm_8000", "mulaw_8000", "mp3", "opus")
SAMPLE_BYTES = {"pcm": 2, "pcm_24000": 2, "pcm_16000": 2, "pcm_8000": 2, "mulaw_8000": 1}  # measured formats
SPACINGS = ("fixed", "poisson")
CHUNKING_KEYS = ("min_chars", "max_chars", "max_wait_ms")
DEFAULT_TURNS = 4
# An agent's reply: a short opening sentence (the first piece a threshold can cut early), a long
# one with a clause, a question; 152 characters, 35 tokens, about 10 s of speech.
AGENT_TEXT = ("Sure, I can help with that. Your order left our warehouse this morning, and it should arrive "
              "on Thursday. Is there anything else I can do for you today?")
# Turn outcomes. done / cancelled / error: the server's event ended it; lost: the connection
# closed or --timeout-s passed first; not_run: its connection ended before it could start.
OUTCOMES = ("done", "cancelled", "error", "lost", "not_run")
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


# ---------------------------------------------------------------------------------- the wire

def _audio_seconds(nbytes: int, sample_bytes: int, rate: int) -> float:
    return nbytes // sample_bytes / rate


@dataclass
class Turn:
    """One turn as the client saw it (``time.perf_counter`` stamps)."""

    turn_id: str
    index: int = 0  # the turn's place on its connection (0: the connection's first)
    cancel_planned: bool = False
    sample_bytes: int | None = None  # None: a compressed format, measured in bytes only
    rate: int = 24_000
    first_delta: float | None = None  # stamped just before sending it
    flushed: float | None = None
    cancel_sent: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    ended_at: float | None = None
    outcome: str | None = None
    code: str | None = None
    message: str | None = None
    done: dict | None = None  # the server's done event
    frames: int = 0
    bytes: int = 0
    next_seq: int = 0
    seq_errors: int = 0
    frames_after_cancel_sent: int = 0
    frames_after_end: int = 0
    pieces: int = 0
    send_lag_s: float = 0.0  # latest a delta went out after it was due (a saturated client shows here)
    stalls: int = 0
    playback: Playback = field(default_factory=Playback)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set at the first audio and at the end
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def audio_s(self) -> float | None:
        return None if self.sample_bytes is None else _audio_seconds(self.bytes, self.sample_bytes, self.rate)

    def on_audio(self, now: float, seq: int, nbytes: int) -> None:
        if self.outcome is not None:  # after done or cancelled: the protocol says none follows
            self.frames_after_end += 1
            return
        if seq != self.next_seq:
            self.seq_errors += 1
        self.next_seq = seq + 1
        self.frames += 1
        if self.cancel_sent is not None:
            self.frames_after_cancel_sent += 1
        if self.first_audio is None:
            self.first_audio = now
            self.wake.set()
        self.last_audio = now
        if self.sample_bytes is not None:
            before, stalled = self.audio_s, self.playback.stall_s
            self.bytes += nbytes
            self.playback.receive(now, self.audio_s - before)
            self.stalls += int(self.playback.stall_s > stalled)
        else:
            self.bytes += nbytes

    def end(self, now: float, outcome: str, code: str | None = None, message: str | None = None) -> None:
        assert outcome in OUTCOMES and self.outcome is None
        self.outcome, self.code, self.message, self.ended_at = outcome, code, message, now
        self.wake.set()
        self.ended.set()


@dataclass
class ConnectionLog:
    """One connection: its turns, and what happened outside them."""

    turns: list[Turn] = field(default_factory=list)
    ready: dict | None = None
    errors: dict[str, int] = field(default_factory=dict)  # handshake, config, connection-level, client side
    samples: list[str] = field(default_factory=list)
    close_code: int | None = None
    unknown_turn_frames: int = 0
    bad_frames: int = 0
    late_events: int = 0  # an event for no open turn (e.g. cancelled after a cancel lost its race to done)
    last_error: str | None = None

    def error(self, code: str, message: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        self.last_error = code
        if len(self.samples) < 5:
            self.samples.append(f"{code}: {message}")

    def open_turn(self, turn_id: str) -> Turn | None:
        for turn in reversed(self.turns):
            if turn.turn_id == turn_id:
                return turn
        return None

    def on_frame(self, now: float, data: bytes) -> None:
        try:
            frame = parse_audio_frame(data)  # the protocol's one client-side parser
        except ProtocolError:
            self.bad_frames += 1
            return
        turn = self.open_turn(frame.turn_id)
        if turn is None:
            self.unknown_turn_frames += 1
        else:
            turn.on_audio(now, frame.seq, len(frame.data))

    def on_event(self, now: float, text: str) -> None:
        try:
            event = json.loads(text)
            kind, turn_id = event["type"], event.get("turn_id")
        except (ValueError, KeyError, TypeError, AttributeError):
            self.error("bad_event", text[:200])
            return
        turn = self.open_turn(turn_id) if turn_id is not None else None
        if kind == "error" and turn_id is None:
            self.error(str(event.get("code")), str(event.get("message")))
        elif turn is None or (turn.outcome is not None and kind in ("done", "cancelled", "error")):
            self.late_events += 1
        elif kind == "piece":
            turn.pieces += 1
        elif kind == "done":
            turn.done = event
            turn.end(now, "done")
        elif kind == "cancelled":
            turn.end(now, "cancelled")
        elif kind == "error":
            turn.end(now, "error", str(event.get("code")), str(event.get("message")))

    def closed(self, now: float, code: int | None) -> None:
        self.close_code = code
        for turn in self.turns:
            if turn.outcome is None:
                turn.end(now, "lost", "connection_closed",
                         f"connection closed ({code})" + (f" after error {self.last_error}" if self.last_error else ""))


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

def _pcts(values: list[float]) -> dict:
    return {"p50": _pct(values, 50), "p90": _pct(values, 90), "p99": _pct(values, 99), "max": _pct(values, 100)}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _turn_timings(turn: Turn) -> dict:
    """The ``timings`` of the turn's ``done`` event ({} without one)."""
    return (turn.done or {}).get("timings") or {}


def _timing(turn: Turn, key: str) -> float | None:
    return _number(_turn_timings(turn).get(key))


def _timings(turns: list[Turn], key: str) -> list[float]:
    return [v for t in turns if (v := _timing(t, key)) is not None]


# the server's split of a turn's first piece (``done``'s ``timings.first_piece``), seconds from its cut
FIRST_PIECE_TIMINGS = ("submitted_s", "first_token_s", "first_window_s", "first_pass_s", "first_audio_s")


def _first_piece(turns: list[Turn], key: str) -> list[float]:
    split = [_turn_timings(t).get("first_piece") or {} for t in turns]
    return [v for s in split if (v := _number(s.get(key))) is not None]


def summarize(concurrency: int, turns_each: int, logs: list[ConnectionLog], wall_s: float, fmt: str) -> dict:
    """The per-level figures of the report (docs/benchmarks.md, "Voice-agent latency")."""
    turns = [t for log in logs for t in log.turns]
    counts = {o: sum(1 for t in turns if t.outcome == o) for o in OUTCOMES}
    counts["not_run"] = concurrency * turns_each - len(turns)
    done = [t for t in turns if t.outcome == "done"]
    heard = [(t, t.first_audio - t.first_delta) for t in turns if t.first_audio is not None and t.first_delta]
    first_audio = [s for _, s in heard]
    by_turn = {"first": [s for t, s in heard if t.index == 0], "later": [s for t, s in heard if t.index > 0]}
    waits = [(t, _timing(t, "threshold_wait_s")) for t in done if t.first_audio is not None and t.first_delta]
    added = [t.first_audio - t.first_delta - w for t, w in waits if w is not None]
    flush_to_last = [t.last_audio - t.flushed for t in done if t.last_audio is not None and t.flushed is not None]
    codes: dict[str, int] = {}
    for key in [t.code for t in turns if t.outcome in ("error", "lost")] + \
            [c for log in logs for c, n in log.errors.items() for _ in range(n)]:
        codes[key] = codes.get(key, 0) + 1
    closes: dict[str, int] = {}
    for log in logs:
        closes[str(log.close_code)] = closes.get(str(log.close_code), 0) + 1
    measured = fmt in SAMPLE_BYTES
    played = [t for t in done if t.frames]
    cancels = [t for t in turns if t.cancel_sent is not None]
    cancelled = [t for t in cancels if t.outcome == "cancelled"]
    samples = [f"{t.turn_id} {t.outcome} {t.code}: {t.message}" for t in turns if t.outcome in ("error", "lost")]
    return {
        "connections": concurrency, "turns_per_connection": turns_each,
        "ready": sum(1 for log in logs if log.ready is not None), "turns": counts,
        "error_codes": codes, "error_samples": (samples + [s for log in logs for s in log.samples])[:5],
        "close_codes": closes, "wall_s": round(wall_s, 3),
        "first_audio_s": _pcts(first_audio),
        # each connection's first turn apart from its later ones: without a ramp the N first turns
        # start within one token interval of each other, the level's burst
        "first_audio_s_by_turn": {part: _pcts(values) for part, values in by_turn.items()},
        "threshold_wait_s": _pcts([w for _, w in waits if w is not None]),
        "server_added_s": _pcts(added),
        "server_first_audio_s": _pcts(_timings(done, "first_text_to_first_audio_s")),
        "server_first_piece_s": {key: _pcts(_first_piece(done, key)) for key in FIRST_PIECE_TIMINGS},
        "flush_to_last_audio_s": _pcts(flush_to_last),
        "server_flush_to_last_audio_s": _pcts(_timings(done, "flush_to_last_audio_s")),
        "pieces_per_turn": _pcts([t.pieces for t in done]),
        "frames": sum(t.frames for t in turns), "bytes": sum(t.bytes for t in turns),
        "audio_s": round(sum(t.audio_s for t in turns), 3) if measured else None,
        "done_turns_audio_s": {  # the audio of done turns as received, and as their done events say
            "client": round(sum(t.audio_s for t in done), 3) if measured else None,
            "server": round(sum(float(t.done.get("audio_seconds") or 0.0) for t in done), 3)},
        "throughput_audio_s_per_s":
            round(sum(t.audio_s for t in turns) / wall_s, 3) if measured and wall_s > 0 else None,
        "stalls": None if not measured else {
            "turns_measured": len(played), "turns_with_stall": sum(1 for t in played if t.stalls),
            "count": sum(t.stalls for t in played), "stall_s": _pcts([t.playback.stall_s for t in played]),
        },
        "cancel": {
            "sent": len(cancels), "cancelled": len(cancelled),
            "done_first": sum(1 for t in cancels if t.outcome == "done"),
            "to_cancelled_s": _pcts([t.ended_at - t.cancel_sent for t in cancelled]),
            "to_last_audio_s": _pcts([max(0.0, t.last_audio - t.cancel_sent) for t in cancelled]),
            "frames_after_cancel_sent": sum(t.frames_after_cancel_sent for t in cancels),
            "frames_after_cancelled": sum(t.frames_after_end for t in cancelled),
        },
        "protocol_errors": {
            "seq": sum(t.seq_errors for t in turns),
            "frames_after_done": sum(t.frames_after_end for t in done),
            "frames_after_cancelled": sum(t.frames_after_end for t in cancelled),
            "frames_of_unknown_turns": sum(log.unknown_turn_frames for log in logs),
            "bad_frames": sum(log.bad_frames for log in logs),
            "late_events": sum(log.late_events for log in logs),
        },
        "send_lag_s": _pcts([t.send_lag_s for t in turns if t.first_delta is not None]),
    }


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


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f} ms"


def _progress_line(level: dict) -> None:
    turns, stalls, cancel = level["turns"], level["stalls"], level["cancel"]
    planned = sum(turns.values())
    stall = "-" if stalls is None else f"{stalls['turns_with_stall']}/{stalls['turns_measured']} turns stalled"
    cancels = f"; cancel->cancelled p99 {_ms(cancel['to_cancelled_s']['p99'])}" if cancel["sent"] else ""
    # by code: a refusal (overloaded) is not an error of the run, and the first audio counts neither
    codes = ", ".join(f"{code} {n}" for code, n in sorted(level["error_codes"].items()))
    print(f"connections {level['connections']}: {turns['done']}/{planned} turns done, {turns['cancelled']} cancelled, "
          f"{turns['error'] + turns['lost'] + turns['not_run']} failed{f' ({codes})' if codes else ''}; first audio p50 "
          f"{_ms(level['first_audio_s']['p50'])} p99 {_ms(level['first_audio_s']['p99'])} (server-added p99 "
          f"{_ms(level['server_added_s']['p99'])}); flush->last audio p99 "
          f"{_ms(level['flush_to_last_audio_s']['p99'])}; {stall}{cancels}; {level['wall_s']:.1f} s", file=sys.stderr)


def run_agent(cfg: AgentBenchConfig, *, progress: bool = False) -> dict:
    """Run every level and return the report (a JSON-ready dict)."""
    return asyncio.run(run_agent_async(cfg, _progress_line if progress else None))
