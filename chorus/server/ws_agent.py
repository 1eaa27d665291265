"""The voice-agent WebSocket, ``WS /v1/audio/speech/stream``: the handshake, the connection's
messages and limits, and draining. The protocol is documented in docs/voice-agents.md; a turn's
pieces and audio live in ``ws_turn.py``.

A connection is configured once (``config``: the model, the voice and the SpeechBody fields that
make sense per connection, all checked by ``SpeechBody`` itself, ``timestamps`` among them (a
``timestamps`` event after each piece's audio), and the response format and the text
threshold); then ``text`` deltas open and feed turns, ``flush`` ends a turn's text, ``cancel``
drops a turn at once and ``close`` finishes every turn and closes. Protocol errors
(a message that is not a JSON object with a known ``type``, one before ``config``, one without a
valid ``turn_id``) end the connection; errors of one turn (a malformed message naming a valid
``turn_id`` included) end that turn only.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from chorus.server.errors import APIError, validation_error
from chorus.server.http.errors import error_response
from chorus.server.schemas import SpeechBody
from chorus.server.registry import affinity_key
from chorus.server.text_pieces import Chunking
from chorus.server.ws_turn import Turn

logger = logging.getLogger("chorus.server")

FORMATS = ("pcm", "pcm_24000", "pcm_16000", "pcm_8000", "mulaw_8000", "mp3", "opus")
# the SpeechBody fields a connection may set (the others are per request: input, speed, ...)
BODY_FIELDS = ("model", "voice", "exaggeration", "cfg_weight", "temperature", "top_p", "min_p", "top_k",
               "repetition_penalty", "seed", "language", "priority", "flow_steps", "max_new_tokens", "timestamps")
CONFIG_FIELDS = ("type", "response_format", "chunking", *BODY_FIELDS)
MAX_TURN_ID_CHARS = 128
TURN_FIELDS = {"text": ("type", "turn_id", "text"), "flush": ("type", "turn_id"), "cancel": ("type", "turn_id")}
CLOSED_TURN_IDS = 1024  # closed turn ids remembered per connection (their text is refused)
# close codes (RFC 6455 and the protocol's own 4401)
NORMAL, GOING_AWAY, POLICY, TOO_BIG, INTERNAL, TRY_LATER, UNAUTHORIZED = 1000, 1001, 1008, 1009, 1011, 1013, 4401
_CLOSE_BY_STATUS = {401: UNAUTHORIZED, 501: INTERNAL, 503: TRY_LATER}


@dataclass(frozen=True)
class Settings:
    """A connection's configuration, checked."""

    body: SpeechBody  # the connection's fields; each piece is a copy with its text as ``input``
    response_format: str
    chunking: Chunking
    voice: object  # the voice, looked up once
    priority: int
    sample_rate: int  # of the audio bytes

    @property
    def language(self) -> str | None:
        return self.body.language


class _Close(Exception):
    """End the connection with ``code``, after an ``error`` event when ``error`` is given."""

    def __init__(self, code: int, error: APIError | None = None):
        super().__init__(code)
        self.code, self.error = code, error


class AgentHub:
    """The server's voice-agent connections: their count and limit, and draining."""

    def __init__(self, backend):
        """``backend``: the process's :class:`~chorus.server.registry.ModelRegistry`; each turn
        runs on the model version its connection's key routes to."""
        self.backend = backend
        self.config = backend.config
        self.connections: set[Connection] = set()
        self.draining = False
        self.grace_over = False
        backend.hold_drain(self.open_turns_on)

    def open_turns_on(self, service) -> int:
        """Turns open on one model version (its drain waits for them)."""
        return sum(1 for c in self.connections for t in c.turns.values() if t.service is service)

    async def serve(self, websocket: WebSocket, authorized: bool) -> None:
        """One connection, from the handshake to its close."""
        if not authorized:
            return await _refuse(websocket, APIError(
                401, "missing or invalid API key: send 'Authorization: Bearer <key>' or ?api_key=<key>",
                code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}), self.config.retry_after_s)
        if len(self.connections) >= self.config.ws_max_connections:
            return await _refuse(websocket, APIError(
                503, f"the server has {len(self.connections)} WebSocket connections open, its limit; retry later",
                code="too_many_connections", headers={"Retry-After": str(self.config.retry_after_s)}),
                self.config.retry_after_s)
        try:
            self.backend.require_serving()
        except APIError as error:
            return await _refuse(websocket, error, self.config.retry_after_s)
        connection = Connection(self, websocket)
        self.connections.add(connection)
        self.backend.metrics.ws_connections.set(len(self.connections))
        try:
            await websocket.accept()
            await connection.run()
        finally:
            self.connections.discard(connection)
            self.backend.metrics.ws_connections.set(len(self.connections))

    async def drain(self, grace_s: float) -> None:
        """Shutting down: connections take no new turns, each closes (1001) once its open turns
        have finished; after ``grace_s`` the rest are cancelled and closed."""
        self.draining = True
        for connection in list(self.connections):
            connection.wake()
        deadline = time.monotonic() + grace_s
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.grace_over = True
        for connection in list(self.connections):
            connection.wake()
        while self.connections and time.monotonic() < deadline + 5.0:
            await asyncio.sleep(0.05)


async def _refuse(websocket: WebSocket, error: APIError, least_retry_after_s: int) -> None:
    """Refuse the handshake with ``error``'s HTTP status and JSON body; a server without the
    ASGI denial-response extension accepts, sends the ``error`` event and closes instead."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_response(error))
        return
    await websocket.accept()
    await websocket.send_text(json.dumps(error_event(error, None, least_retry_after_s)))
    await websocket.close(_CLOSE_BY_STATUS.get(error.status, POLICY))


def error_event(error: APIError, turn_id: str | None, least_retry_after_s: int) -> dict:
    """The ``error`` event of ``error``: every 429 and 503 carries ``retry_after_s``, its
    ``Retry-After`` or, where the cause has no better guess, the server's least one
    (``retry_after_s`` of the config)."""
    retry = error.retry_after_s
    if retry is None and error.status in (429, 503):
        retry = float(least_retry_after_s)
    return {"type": "error", "turn_id": turn_id, "code": error.code, "message": error.message,
            "status": error.status, "retry_after_s": retry}


def _protocol_error(message: str, code: str = "invalid_message") -> _Close:
    return _Close(POLICY, APIError(400, message, code=code))


class Connection:
    def __init__(self, hub: AgentHub, websocket: WebSocket):
        self.hub, self.websocket = hub, websocket
        self.backend, self.config = hub.backend, hub.config
        self.id = f"ws-{uuid.uuid4().hex[:16]}"
        # the key that picks the model version of each turn: the affinity header, else the API key
        # (a query-string key included), else the connection's id; sticky while the weights stay
        self.affinity = affinity_key(websocket.headers, websocket.query_params.get("api_key")) or self.id
        self.settings: Settings | None = None
        self.turns: dict[str, Turn] = {}
        self.closed_ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.turn_index = 0
        self.closing = False  # the client sent close: finish the turns, then close
        self.last_activity = time.monotonic()
        self._wake = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._lost: str | None = None  # why sending failed (the client is gone or not reading)

    def wake(self) -> None:
        self._wake.set()

    # -- the reader ---------------------------------------------------------------------------
    async def run(self) -> None:
        receiving: asyncio.Future | None = None
        code, error = NORMAL, None
        try:
            while True:
                self._check_state()
                receiving = receiving or asyncio.ensure_future(self.websocket.receive())
                waking = asyncio.ensure_future(self._wake.wait())
                done, _ = await asyncio.wait({receiving, waking}, timeout=self._idle_left(),
                                             return_when=asyncio.FIRST_COMPLETED)
                waking.cancel()
                self._wake.clear()
                if receiving in done:
                    message, receiving = receiving.result(), None
                    if message["type"] == "websocket.disconnect":
                        self._lost = "client_disconnected"
                        return
                    self.last_activity = time.monotonic()
                    await self._handle(message)
        except _Close as close:
            code, error = close.code, close.error
        except WebSocketDisconnect:
            self._lost = "client_disconnected"
        except Exception:  # a bug: the connection ends, the server goes on
            logger.exception("voice-agent connection %s failed", self.id)
            code, error = INTERNAL, APIError(500, "internal server error", code="internal_error")
        finally:
            if receiving is not None:
                receiving.cancel()
            status = self._lost or ("shutting_down" if self.hub.draining else "cancelled")
            for turn in list(self.turns.values()):
                await turn.cancel(status)
            if self._lost == "slow_reader":
                code, error = POLICY, None  # it reads nothing: an error event would wait behind the rest
            if self._lost != "client_disconnected":
                await self._close(code, error)

    def _check_state(self) -> None:
        """Raise the close the connection's state calls for, if any."""
        if self._lost is not None:
            raise _Close(POLICY)
        if self.hub.grace_over or (self.hub.draining and not self.turns):
            raise _Close(GOING_AWAY, APIError(503, "the server is shutting down; reconnect to another replica",
                                              code="shutting_down", headers={"Retry-After": "5"}))
        if self.closing and not self.turns:
            raise _Close(NORMAL)

    def _idle_left(self) -> float | None:
        if self.turns:
            return None
        left = self.last_activity + self.config.ws_idle_timeout_s - time.monotonic()
        if left <= 0:
            raise _Close(NORMAL, APIError(408, f"no message and no open turn for "
                                               f"{self.config.ws_idle_timeout_s:g} s", code="idle_timeout"))
        return left

    async def _close(self, code: int, error: APIError | None) -> None:
        with contextlib.suppress(Exception):  # the client may be gone already
            if error is not None:
                await self.send_error(error, None)
            if self.websocket.application_state != WebSocketState.DISCONNECTED:
                await asyncio.wait_for(self.websocket.close(code), min(5.0, self.config.write_stall_s))

    async def _handle(self, message: dict) -> None:
        text = message.get("text")
        if text is None:
            size = len(message.get("bytes") or b"")
            if size > self.config.ws_max_message_bytes:
                raise self._too_big(size)
            raise _protocol_error("binary messages are not part of the protocol; send JSON text messages")
        if len(text) > self.config.ws_max_message_bytes or len(text.encode()) > self.config.ws_max_message_bytes:
            raise self._too_big(len(text.encode()))
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _protocol_error(f"a message is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise _protocol_error('a message must be a JSON object with a "type"')
        kind = data["type"]
        if self.closing:
            return  # after close only the turns in flight matter
        if kind == "config":
            if self.settings is not None:
                raise _protocol_error("the connection is configured already; open a new one for other settings",
                                      code="config_already_set")
            self.settings = await self._configure(data)
            return await self.send_event({
                "type": "ready", "connection_id": self.id, "sample_rate": self.settings.sample_rate,
                "response_format": self.settings.response_format, "chunking": self.settings.chunking.as_dict()})
        if self.settings is None:
            raise _Close(POLICY, APIError(400, 'the first message must be {"type": "config", "model": ...}',
                                          code="config_required"))
        now = time.perf_counter()
        if kind in TURN_FIELDS:
            turn_id = _turn_id(data)  # without a valid one the message is the connection's error
            problem = _unknown_field(data, TURN_FIELDS[kind])
            if problem is None and kind == "text" and not isinstance(data.get("text"), str):
                problem = 'a text message needs "text": a string'
            if problem is not None:
                return await self._refuse_for_turn(turn_id, problem)
        if kind == "text":
            await self._text(turn_id, data["text"], now)
        elif kind == "flush":
            turn = await self._open_turn(turn_id, now)
            if turn is not None:
                turn.flush(now)
        elif kind == "cancel":
            turn = self.turns.get(turn_id)
            if turn is not None:
                await turn.cancel()
            self._forget(turn_id)
            await self.send_event({"type": "cancelled", "turn_id": turn_id})
        elif kind == "close":
            problem = _unknown_field(data, ("type",))
            if problem is not None:
                raise _protocol_error(problem)
            self.closing = True
            for turn in list(self.turns.values()):
                if not turn.flushed:
                    turn.flush(now)
        else:
            raise _protocol_error(f"unknown message type {kind!r}; the types are config, text, flush, cancel "
                                  "and close")

    async def _refuse_for_turn(self, turn_id: str, problem: str) -> None:
        """A malformed message for turn ``turn_id``: the turn's error, not the connection's. An
        open turn ends (a delta of its text may be lost); the connection and its other turns go on."""
        turn = self.turns.get(turn_id)
        if turn is not None:
            await turn.cancel(outcome="error")
        await self.send_error(APIError(400, problem, code="invalid_message"), turn_id)

    def _too_big(self, size: int) -> _Close:
        return _Close(TOO_BIG, APIError(413, f"a message of {size} bytes is over the limit of "
                                             f"{self.config.ws_max_message_bytes}", code="message_too_big"))

    async def _text(self, turn_id: str, text: str, now: float) -> None:
        turn = await self._open_turn(turn_id, now)
        if turn is None:
            return
        if turn.flushed:
            return await self.send_error(APIError(400, f"turn {turn_id!r} was flushed; text for it is refused",
                                                  code="turn_closed"), turn_id)
        cap = self.config.ws_text_buffer_chars
        if turn.buffered_chars + len(text) > cap:
            await turn.cancel(outcome="error")
            return await self.send_error(APIError(
                413, f"turn {turn_id!r} holds more than {cap} characters not yet spoken; send text no faster than "
                     f"it is spoken, or in more turns", code="text_buffer_full"), turn_id)
        turn.add_text(text, now)

    async def _open_turn(self, turn_id: str, now: float) -> Turn | None:
        """The open turn ``turn_id``, opened now if it is new; None (with an error sent) when it
        is closed or cannot open."""
        turn = self.turns.get(turn_id)
        if turn is not None:
            return turn
        error = None
        if turn_id in self.closed_ids:
            error = APIError(400, f"turn {turn_id!r} has ended; use a new turn_id", code="turn_closed")
        elif self.hub.draining:
            error = APIError(503, "the server is shutting down; no new turns", code="shutting_down",
                             headers={"Retry-After": "5"})
        elif len(self.turns) >= self.config.ws_max_turns:
            error = APIError(429, f"{len(self.turns)} turns are open on this connection, its limit; flush or "
                                  f"cancel one first", code="too_many_turns")
        if error is not None:
            await self.send_error(error, turn_id)
            return None
        turn = Turn(self, turn_id, self.turn_index, now)
        self.turn_index += 1
        self.turns[turn_id] = turn
        return turn

    def _forget(self, turn_id: str) -> None:
        self.closed_ids[turn_id] = None
        self.closed_ids.move_to_end(turn_id)
        while len(self.closed_ids) > CLOSED_TURN_IDS:
            self.closed_ids.popitem(last=False)

    def turn_ended(self, turn: Turn, outcome: str) -> None:
        """Called by a turn once, when it ended (done, cancelled or error)."""
        if self.turns.get(turn.id) is turn:
            del self.turns[turn.id]
        self._forget(turn.id)
        turn.service.metrics.ws_turns.labels(outcome).inc()
        self.last_activity = time.monotonic()
        self.wake()

    async def _configure(self, data: dict) -> Settings:
        unknown = [k for k in data if k not in CONFIG_FIELDS]
        if unknown:
            raise _Close(POLICY, APIError(400, f"unknown config field {unknown[0]!r}; the fields are "
                                               f"{', '.join(CONFIG_FIELDS[1:])}", code="invalid_parameter",
                                          param=unknown[0]))
        fmt = data.get("response_format", "pcm")
        if fmt not in FORMATS:
            raise _invalid(f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format")
        chunking = _chunking(data.get("chunking"), self.config.ws_chunking())
        if chunking.max_chars > self.config.max_input_chars:
            raise _invalid(f"chunking.max_chars must be at most {self.config.max_input_chars} (the server's "
                           f"max_input_chars), got {chunking.max_chars}", "chunking")
        fields = {k: v for k, v in data.items() if k in BODY_FIELDS}
        try:
            body = SpeechBody.model_validate({**fields, "input": "-", "response_format": "pcm"})
        except ValidationError as exc:
            raise _Close(POLICY, validation_error(exc)) from None
        try:
            service = self.backend.serving(body.model, self.affinity)
        except APIError as error:
            raise _Close(POLICY, error) from None
        try:
            service.require_serving()
        except APIError as error:
            raise _Close(TRY_LATER, error) from None
        try:
            priority, voice = await service.configure_stream(body)
        except APIError as error:
            raise _Close(POLICY, error) from None
        from chorus.audio.streaming import RAW_RATES
        from chorus.models.s3gen.s3gen import SAMPLE_RATE

        return Settings(body, fmt, chunking, voice, priority, RAW_RATES.get(fmt, SAMPLE_RATE))

    # -- sending ------------------------------------------------------------------------------
    async def send_event(self, event: dict) -> None:
        await self._send(self.websocket.send_text, json.dumps(event))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(self.websocket.send_bytes, data)

    async def send_error(self, error: APIError, turn_id: str | None) -> None:
        self.backend.record_error(error.code, error.rule)
        await self.send_event(error_event(error, turn_id, self.config.retry_after_s))

    async def _send(self, send, payload) -> None:
        """Send one message; a client that reads nothing for ``write_stall_s`` is dropped."""
        if self._lost is not None:
            raise ConnectionAbortedError(self._lost)
        async with self._send_lock:
            # not asyncio.wait_for: on Python < 3.12 it can swallow a cancellation that arrives as
            # the send completes, and a cancelled turn must stop at once
            sending = asyncio.ensure_future(send(payload))
            try:
                done, _ = await asyncio.wait({sending}, timeout=self.config.write_stall_s)
            except asyncio.CancelledError:
                sending.cancel()
                raise
            if not done:
                sending.cancel()
                self._lost = "slow_reader"
                self.wake()
                raise ConnectionAbortedError("slow_reader")
            try:
                sending.result()
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                self._lost = "client_disconnected"
                self.wake()
                raise ConnectionAbortedError("client_disconnected") from exc


def _unknown_field(data: dict, fields: tuple[str, ...]) -> str | None:
    """What is wrong with a message of ``fields`` that has another, or None."""
    unknown = [k for k in data if k not in fields]
    if not unknown:
        return None
    return f"unknown field {unknown[0]!r} in a {data['type']} message; its fields are {', '.join(fields[1:]) or 'none'}"


def _turn_id(data: dict) -> str:
    turn_id = data.get("turn_id")
    if not isinstance(turn_id, str) or not 1 <= len(turn_id) <= MAX_TURN_ID_CHARS:
        raise _protocol_error(f'a {data["type"]} message needs "turn_id": a string of 1-{MAX_TURN_ID_CHARS} '
                              "characters")
    return turn_id


def _invalid(message: str, param: str) -> _Close:
    return _Close(POLICY, APIError(400, message, code="invalid_parameter", param=param))


def _chunking(given, defaults: Chunking) -> Chunking:
    if given is None:
        return defaults
    if not isinstance(given, dict):
        raise _invalid("chunking must be an object: {min_chars, max_chars, max_wait_ms}", "chunking")
    unknown = [k for k in given if k not in defaults.as_dict()]
    if unknown:
        raise _invalid(f"unknown field 'chunking.{unknown[0]}'; the chunking fields are min_chars, max_chars, "
                       "max_wait_ms", f"chunking.{unknown[0]}")
    try:
        return Chunking(**{**defaults.as_dict(), **given})
    except ValueError as exc:
        raise _invalid(str(exc), "chunking") from None
