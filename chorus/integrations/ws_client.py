"""An asyncio client of the voice-agent WebSocket (``WS /v1/audio/speech/stream``,
docs/voice-agents.md): the one owner of the wire protocol on the client side. The Pipecat and
LiveKit plugins are built on it; it can be used on its own too::

    config = StreamConfig(model="chatterbox-turbo", voice="default")
    async with await SpeechSocket.connect("http://localhost:8000", config) as socket:
        router = TurnRouter(socket)
        turn = router.open()
        for token in ("Hello ", "there, ", "how are ", "you?"):
            await turn.send_text(token)
        await turn.flush()
        async for event in turn:          # Piece and Audio events, until the turn's `done`
            if isinstance(event, Audio):
                play(event.data)          # s16le mono PCM at socket.sample_rate

With ``StreamConfig(timestamps="word")`` (or ``"character"``) each piece's audio is followed by a
``Timestamps`` event: its words (or characters) in seconds from the start of the turn's audio.

``SpeechSocket`` is one connection: send methods, ``receive()`` for every event in order, and
the protocol's invariants checked as events arrive (per-turn ``seq`` from 0 without gaps, no
audio or timestamps of a turn after its ``done``/``cancelled``/``error``, no timestamps that were
not asked for). ``TurnRouter`` reads a socket and hands each ``Turn`` its own events, for
callers that run several turns at once.
Built on ``websockets`` (its asyncio API, 13.1 or later)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Union
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect as websocket_connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidStatus

PATH = "/v1/audio/speech/stream"
# The response formats that are 16-bit mono PCM, by sample rate (docs/voice-agents.md).
PCM_FORMATS = {24_000: "pcm", 16_000: "pcm_16000", 8_000: "pcm_8000"}
TIMESTAMPS = ("word", "character")  # StreamConfig.timestamps, besides None (off)
_ENDED_TURNS_KEPT = 4096  # ended turn ids remembered per socket, to catch audio after the end
# The largest frame accepted (websockets' default, 1 MiB, is 22 s of 24 kHz PCM: a frame carries
# whatever audio the pipeline yielded at once, which a long final window can approach).
MAX_FRAME_BYTES = 16 << 20


def stream_url(base_url: str) -> str:
    """The WebSocket URL of a server: ``http://host:8000`` -> ``ws://host:8000/v1/audio/speech/stream``
    (``https`` -> ``wss``); a ``ws://``/``wss://`` URL with a path is used as it is."""
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"base_url must be http(s):// or ws(s)://host[:port], got {base_url!r}")
    path = parts.path.rstrip("/")
    if not path or (parts.scheme in ("http", "https") and path == "/v1"):
        path = PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def pcm_format(sample_rate: int) -> str:
    """The response format that is s16le mono PCM at ``sample_rate`` (24, 16 or 8 kHz)."""
    if sample_rate not in PCM_FORMATS:
        raise ValueError(f"the server sends raw PCM at {sorted(PCM_FORMATS)} Hz, not {sample_rate}")
    return PCM_FORMATS[sample_rate]


@dataclass(frozen=True)
class Chunking:
    """Overrides of the server's text threshold for one connection (``None``: the server's)."""

    min_chars: int | None = None
    max_chars: int | None = None
    max_wait_ms: int | None = None


@dataclass(frozen=True)
class StreamConfig:
    """The connection's ``config`` message: sticky for the connection. ``None`` leaves a field to
    the server's default; the server validates every value (an unknown or bad one is an error
    naming it), so nothing is checked twice here, except ``timestamps``: it also says which
    events the client expects, so a bad value is a ``ValueError`` at once, before connecting."""

    model: str
    voice: str = "default"
    response_format: str = "pcm"
    exaggeration: float | None = None
    cfg_weight: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    min_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    language: str | None = None
    priority: str | None = None
    flow_steps: int | None = None
    max_new_tokens: int | None = None
    timestamps: str | None = None
    chunking: Chunking | None = None

    def __post_init__(self):
        if self.timestamps is not None and self.timestamps not in TIMESTAMPS:
            raise ValueError(f"timestamps must be None (off), 'word' or 'character', not {self.timestamps!r}")

    def message(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": "config"}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Chunking):
                value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
            if value is not None:
                body[field.name] = value
        return body


# --- events -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    connection_id: str
    sample_rate: int
    response_format: str
    chunking: dict[str, int]


@dataclass(frozen=True)
class Piece:
    """A piece of the turn's text went to synthesis (offsets into the turn's whole text)."""

    turn_id: str
    piece: int
    text: str
    char_start: int
    char_end: int


@dataclass(frozen=True)
class Audio:
    """One binary frame: audio bytes in the connection's response format."""

    turn_id: str
    seq: int
    data: bytes


@dataclass(frozen=True)
class TimedText:
    """A word (or character) and where it is in the turn's audio, in seconds from its first sample."""

    text: str
    start: float
    end: float


@dataclass(frozen=True)
class Timestamps:
    """A ``timestamps`` event: the words (``unit`` "word") or characters ("character") of piece
    ``piece``, sent after all its audio. ``method``: "alignment" (the model's attention) or
    "estimate" (from the text alone); docs/timestamps.md says what each promises."""

    turn_id: str
    piece: int
    method: str
    unit: str
    items: tuple[TimedText, ...]


@dataclass(frozen=True)
class Done:
    turn_id: str
    audio_seconds: float
    usage: dict[str, int]
    timings: dict[str, float | None]


@dataclass(frozen=True)
class Cancelled:
    turn_id: str


@dataclass(frozen=True)
class ErrorEvent:
    """An ``error`` event: with a ``turn_id`` it ended that turn; without one it is about the
    connection (a close follows). ``status`` is what POST /v1/audio/speech would answer."""

    turn_id: str | None
    code: str
    message: str
    status: int
    retry_after_s: float | None = None


Event = Union[Ready, Piece, Audio, Timestamps, Done, Cancelled, ErrorEvent]
_TERMINAL = (Done, Cancelled, ErrorEvent)


class ProtocolError(Exception):
    """The server sent something the protocol does not allow."""


class ChorusError(Exception):
    """An ``error`` from the server as an exception (``.event``): a refused handshake, a refused
    ``config``, or the error that ended a turn."""

    def __init__(self, event: ErrorEvent):
        super().__init__(f"{event.code} ({event.status}): {event.message}")
        self.event = event


class ConnectionLost(Exception):
    """The connection ended while a turn was open. ``close_code`` is the WebSocket close code
    (None: no close frame came); ``error`` the connection-level error event that preceded it."""

    def __init__(self, close_code: int | None, reason: str, error: ErrorEvent | None):
        detail = f": {error.code}: {error.message}" if error else (f": {reason}" if reason else "")
        super().__init__(f"the Chorus connection closed (code {close_code}){detail}")
        self.close_code = close_code
        self.error = error


def _field(body: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{body.get('type')!r} event: {name!r} is {value!r}")
    return value


def _timed(body: dict) -> tuple[str, tuple[TimedText, ...]]:
    """The unit and the items of a ``timestamps`` event: Cartesia's parallel lists
    ``{"words" | "characters", "start", "end"}`` under ``word_timestamps`` or ``character_timestamps``."""
    for unit in TIMESTAMPS:
        lists = body.get(f"{unit}_timestamps")
        if lists is None:
            continue
        texts, starts, ends = (lists.get(key) if isinstance(lists, dict) else None
                               for key in (f"{unit}s", "start", "end"))
        if not (isinstance(texts, list) and isinstance(starts, list) and isinstance(ends, list)
                and len(texts) == len(starts) == len(ends)
                and all(isinstance(t, str) for t in texts)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in starts + ends)):
            raise ProtocolError(f"timestamps event: {unit}_timestamps is {lists!r}")
        return unit, tuple(TimedText(t, float(a), float(b)) for t, a, b in zip(texts, starts, ends))
    raise ProtocolError(f"timestamps event without word_timestamps or character_timestamps: {sorted(body)}")


def parse_event(text: str) -> Event:
    """A JSON text frame as an event."""
    try:
        body = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"a text frame that is not JSON: {text[:200]!r}") from e
    if not isinstance(body, dict):
        raise ProtocolError(f"a text frame that is not a JSON object: {text[:200]!r}")
    kind = body.get("type")
    number = (int, float)
    if kind == "ready":
        return Ready(_field(body, "connection_id", str), _field(body, "sample_rate", int),
                     _field(body, "response_format", str), _field(body, "chunking", dict))
    if kind == "piece":
        return Piece(_field(body, "turn_id", str), _field(body, "piece", int), _field(body, "text", str),
                     _field(body, "char_start", int), _field(body, "char_end", int))
    if kind == "timestamps":
        unit, items = _timed(body)
        return Timestamps(_field(body, "turn_id", str), _field(body, "piece", int), _field(body, "method", str),
                          unit, items)
    if kind == "done":
        return Done(_field(body, "turn_id", str), float(_field(body, "audio_seconds", number)),
                    _field(body, "usage", dict), _field(body, "timings", dict))
    if kind == "cancelled":
        return Cancelled(_field(body, "turn_id", str))
    if kind == "error":
        turn_id = body.get("turn_id")
        if turn_id is not None and not isinstance(turn_id, str):
            raise ProtocolError(f"error event: turn_id is {turn_id!r}")
        retry = body.get("retry_after_s")
        return ErrorEvent(turn_id, _field(body, "code", str), _field(body, "message", str),
                          _field(body, "status", int), float(retry) if retry is not None else None)
    raise ProtocolError(f"unknown event type {kind!r}")


def parse_audio_frame(data: bytes) -> Audio:
    """A binary frame: ``u16 big-endian H | H bytes of JSON {"turn_id", "seq"} | audio``."""
    if len(data) < 2:
        raise ProtocolError(f"a binary frame of {len(data)} bytes has no header length")
    size = int.from_bytes(data[:2], "big")
    if len(data) < 2 + size:
        raise ProtocolError(f"a binary frame of {len(data)} bytes announces a {size}-byte header")
    try:
        header = json.loads(data[2:2 + size].decode("utf-8"))
    except ValueError as e:
        raise ProtocolError("a binary frame's header is not UTF-8 JSON") from e
    if not isinstance(header, dict):
        raise ProtocolError(f"a binary frame's header is {header!r}")
    header.setdefault("type", "audio")
    seq = _field(header, "seq", int)
    if seq < 0:
        raise ProtocolError(f"a binary frame's seq is {seq}")
    return Audio(_field(header, "turn_id", str), seq, bytes(data[2 + size:]))


def _handshake_error(error: InvalidStatus) -> ChorusError:
    response = error.response
    code, message = "handshake_refused", f"HTTP {response.status_code}"
    try:
        detail = json.loads(response.body or b"")["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        if response.body:
            message = f"{message}: {response.body[:200].decode('utf-8', 'replace')}"
    retry = response.headers.get("Retry-After")
    return ChorusError(ErrorEvent(None, code, message, response.status_code,
                                  float(retry) if retry and retry.isdigit() else None))


Connect = Callable[..., Awaitable[ClientConnection]]


class SpeechSocket:
    """One connection to ``WS /v1/audio/speech/stream``, configured and ``ready``.

    One coroutine reads (``receive()`` or ``async for``); any may send."""

    def __init__(self, websocket: ClientConnection, ready: Ready, timestamps: str | None = None):
        self.websocket = websocket
        self.ready = ready
        self.timestamps = timestamps  # what the config asked for: the only timestamps accepted
        self.close_error: ErrorEvent | None = None  # the connection-level error before the close
        self._next_seq: dict[str, int] = {}  # open turns: the next audio seq expected
        self._ended: OrderedDict[str, None] = OrderedDict()

    @classmethod
    async def connect(cls, base_url: str, config: StreamConfig, *, api_key: str | None = None,
                      open_timeout: float = 10.0, connect: Connect | None = None) -> SpeechSocket:
        """Open, send ``config`` and wait for ``ready``. Raises ``ChorusError`` when the server
        refuses (bad key, no capacity, not ready, bad config), ``TimeoutError`` after
        ``open_timeout`` s, and ``OSError`` when nothing listens. ``connect``: a replacement for
        ``websockets.asyncio.client.connect`` with its signature (e.g. a framework's own)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return await asyncio.wait_for(cls._open(stream_url(base_url), config, headers, connect or websocket_connect),
                                      open_timeout)

    @classmethod
    async def _open(cls, url: str, config: StreamConfig, headers: dict[str, str], connect: Connect) -> SpeechSocket:
        try:
            websocket = await connect(url, additional_headers=headers, max_size=MAX_FRAME_BYTES)
        except InvalidStatus as e:
            raise _handshake_error(e) from None
        try:
            await websocket.send(json.dumps(config.message()))
            first = await websocket.recv()
            event = parse_audio_frame(first) if isinstance(first, bytes) else parse_event(first)
            if isinstance(event, ErrorEvent):
                raise ChorusError(event)
            if not isinstance(event, Ready):
                raise ProtocolError(f"the answer to config was {event!r}, not ready")
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else None
            reason = e.rcvd.reason if e.rcvd else ""
            raise ChorusError(ErrorEvent(None, "closed", f"closed before ready (code {code}) {reason}".strip(),
                                         401 if code == 4401 else 503)) from None
        except BaseException:  # also a timeout's cancellation: the socket is not left open
            await websocket.close()
            raise
        return cls(websocket, event, config.timestamps)

    @property
    def sample_rate(self) -> int:
        return self.ready.sample_rate

    @property
    def is_open(self) -> bool:
        return self.websocket.close_code is None

    async def _send(self, body: dict[str, Any]) -> None:
        await self.websocket.send(json.dumps(body))

    async def send_text(self, turn_id: str, text: str) -> None:
        """A text delta (any size); the first one of a new ``turn_id`` opens that turn."""
        if turn_id not in self._ended:
            self._next_seq.setdefault(turn_id, 0)
        await self._send({"type": "text", "turn_id": turn_id, "text": text})

    async def flush(self, turn_id: str) -> None:
        """End of the turn's text: all of it is spoken, then ``done``."""
        await self._send({"type": "flush", "turn_id": turn_id})

    async def cancel(self, turn_id: str) -> None:
        """Barge-in: the server drops the turn and answers ``cancelled``; no audio of the turn
        follows that event."""
        await self._send({"type": "cancel", "turn_id": turn_id})

    async def close(self) -> None:
        """Graceful end: the server finishes every open turn, sends their ``done`` and closes
        with 1000; keep receiving until then."""
        await self._send({"type": "close"})

    async def aclose(self) -> None:
        """Close the connection now (the server cancels whatever is open)."""
        await self.websocket.close()

    async def receive(self) -> Event:
        """The next event. Raises ``websockets.ConnectionClosed`` once the connection is closed
        (``close_error`` then holds the connection-level error that preceded the close) and
        ``ProtocolError`` for anything the protocol does not allow."""
        message = await self.websocket.recv()
        if isinstance(message, bytes):
            audio = parse_audio_frame(message)
            expected = self._expected_seq(audio.turn_id, f"audio seq {audio.seq}")
            if audio.seq != expected:
                raise ProtocolError(f"turn {audio.turn_id!r}: audio seq {audio.seq}, expected {expected}")
            self._next_seq[audio.turn_id] = expected + 1
            return audio
        event = parse_event(message)
        if isinstance(event, Ready):
            raise ProtocolError("a second ready event")
        if isinstance(event, Timestamps):
            if event.unit != self.timestamps:
                raise ProtocolError(f"{event.unit} timestamps on a connection that asked for {self.timestamps}")
            self._expected_seq(event.turn_id, f"timestamps of piece {event.piece}")
        if isinstance(event, ErrorEvent) and event.turn_id is None:
            self.close_error = event
        elif isinstance(event, _TERMINAL):
            self._next_seq.pop(event.turn_id, None)
            self._ended[event.turn_id] = None
            if len(self._ended) > _ENDED_TURNS_KEPT:
                self._ended.popitem(last=False)
        return event

    def _expected_seq(self, turn_id: str, what: str) -> int:
        """The next audio seq of an open turn; audio or timestamps of any other is a ProtocolError."""
        expected = self._next_seq.get(turn_id)
        if expected is None:
            state = "after it ended" if turn_id in self._ended else "of a turn never opened"
            raise ProtocolError(f"{what} {state}: turn {turn_id!r}")
        return expected

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        """Every event until a normal close (1000/1001); an abnormal close raises."""
        while True:
            try:
                yield await self.receive()
            except ConnectionClosedOK:
                return

    async def __aenter__(self) -> SpeechSocket:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


_CLOSED = object()


class Turn:
    """One turn on a ``TurnRouter``'s socket. Iterating yields its ``Piece``, ``Audio`` and (when
    the config asked for them) ``Timestamps`` events in the order they came, and stops after
    ``done`` (``outcome`` holds it) or ``cancelled``; an ``error`` of the turn raises
    ``ChorusError``, a lost connection ``ConnectionLost``. After ``cancel()`` no audio or
    timestamps are yielded, also none still in flight."""

    def __init__(self, router: TurnRouter, turn_id: str):
        self.turn_id = turn_id
        self.outcome: Done | Cancelled | ErrorEvent | ConnectionLost | None = None
        self.ended = asyncio.Event()
        self.opened = False  # a text delta was sent: the turn exists on the server
        self.cancel_sent = False
        self.flushed = False
        self._router = router
        self._events: asyncio.Queue[Any] = asyncio.Queue()

    async def send_text(self, text: str) -> None:
        self.opened = True
        await self._router.socket.send_text(self.turn_id, text)

    async def flush(self) -> None:
        self.flushed = True
        await self._router.socket.flush(self.turn_id)

    async def cancel(self) -> None:
        """Send ``cancel`` unless the turn has ended or was cancelled already (idempotent); a
        turn that never sent text just ends here."""
        if self.ended.is_set() or self.cancel_sent:
            return
        self.cancel_sent = True
        if not self.opened:
            self._router.forget(self)
            self.ended.set()
            return
        if self._router.socket.is_open:
            await self._router.socket.cancel(self.turn_id)

    def _deliver(self, item: Any) -> None:
        if isinstance(item, _TERMINAL) or isinstance(item, ConnectionLost):
            self.outcome = item
            self.ended.set()
        self._events.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[Piece | Audio | Timestamps]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Piece | Audio | Timestamps]:
        while True:
            item = await self._events.get()
            if isinstance(item, (Done, Cancelled)):
                return
            if isinstance(item, ErrorEvent):
                raise ChorusError(item)
            if isinstance(item, ConnectionLost):
                raise item
            if isinstance(item, (Audio, Timestamps)) and self.cancel_sent:
                continue  # in flight when we cancelled
            yield item


class TurnRouter:
    """Reads a ``SpeechSocket`` (its only reader) and routes each event to its ``Turn``;
    events of turns it does not know (e.g. in flight after a caller forgot a turn) are dropped.
    When the connection ends, every open turn gets ``ConnectionLost``."""

    def __init__(self, socket: SpeechSocket):
        self.socket = socket
        self.closed: ConnectionLost | Exception | None = None
        self._turns: dict[str, Turn] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="chorus-turn-router")

    def open(self, turn_id: str | None = None) -> Turn:
        """A new turn (its id: ``turn_id`` or a fresh one); it opens on the server with its first
        text delta."""
        if self.closed is not None:
            raise ConnectionLost(None, "the router's connection is closed", self.socket.close_error)
        turn = Turn(self, turn_id or uuid.uuid4().hex)
        assert turn.turn_id not in self._turns, f"turn {turn.turn_id!r} is open already"
        self._turns[turn.turn_id] = turn
        return turn

    def forget(self, turn: Turn) -> None:
        """Stop routing events to ``turn`` (they are dropped from now on)."""
        self._turns.pop(turn.turn_id, None)

    @property
    def open_turns(self) -> int:
        return len(self._turns)

    async def _read(self) -> None:
        try:
            while True:
                event = await self.socket.receive()
                turn = self._turns.get(getattr(event, "turn_id", None) or "")
                if turn is None:
                    continue
                turn._deliver(event)
                if isinstance(event, _TERMINAL):
                    self._turns.pop(turn.turn_id, None)
        except ConnectionClosed as e:
            self.closed = ConnectionLost(e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else "",
                                         self.socket.close_error)
        except Exception as e:  # a ProtocolError: no event of this socket can be trusted any more
            self.closed = e
            await self.socket.aclose()
        finally:
            lost = self.closed if isinstance(self.closed, ConnectionLost) else \
                ConnectionLost(None, str(self.closed or "the router was closed"), self.socket.close_error)
            if self.closed is None:
                self.closed = lost
            for turn in list(self._turns.values()):
                turn._deliver(lost)
            self._turns.clear()

    async def wait_closed(self) -> ConnectionLost | Exception:
        """Until the connection has ended (e.g. the server closed an idle one); why it ended."""
        await asyncio.shield(self._reader)
        assert self.closed is not None
        return self.closed

    async def aclose(self) -> None:
        """Close the connection and stop reading."""
        await self.socket.aclose()
        try:
            await self._reader
        except asyncio.CancelledError:
            pass
