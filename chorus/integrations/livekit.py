"""A LiveKit Agents TTS plugin over the Chorus voice-agent WebSocket
(``pip install 'chorus-tts[livekit]'``)::

    from chorus.integrations import livekit as chorus_livekit
    from chorus.integrations.ws_client import StreamConfig

    session = AgentSession(stt=..., llm=..., vad=...,
                           tts=chorus_livekit.TTS(base_url="http://localhost:8000",
                                                  config=StreamConfig(model="chatterbox-turbo")))

All streams of one ``TTS`` share one WebSocket: each ``stream()`` (and each ``synthesize()``) is
one Chorus turn. Text pushed to the stream goes to the server as it comes (the server's text
threshold decides when a piece is spoken); ``flush()``/``end_input()`` is the turn's ``flush``;
closing the stream before its audio is all out (LiveKit does it on an interruption) sends
``cancel``, and nothing of the turn is pushed after that. The connection opens on first use
(or ``prewarm()``) and again after the server closed it (idle timeout, drain).

With ``word_timestamps`` (on, as in LiveKit's Cartesia plugin) the TTS has the
``aligned_transcript`` capability: each spoken word goes with the audio as a ``TimedString``
(its start and end in seconds of the turn's audio), which an ``AgentSession`` created with
``use_tts_aligned_transcript=True`` uses for its transcript.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref

from livekit.agents import APIConnectionError, APIError, APIStatusError, APITimeoutError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions, TimedString
from websockets.exceptions import WebSocketException

from chorus.integrations.ws_client import (
    Audio, ChorusError, ConnectionLost, Piece, SpeechSocket, StreamConfig, Timestamps, Turn, TurnRouter, pcm_format,
)

logger = logging.getLogger(__name__)


class TTS(tts.TTS):
    """Chorus speech over ``WS /v1/audio/speech/stream``, streamed (``stream()``) or not
    (``synthesize()``)."""

    def __init__(self, *, config: StreamConfig, base_url: str = "http://127.0.0.1:8000",
                 api_key: str | None = None, sample_rate: int = 24_000, word_timestamps: bool = True):
        """``config``: the connection's model, voice and Chatterbox fields; its
        ``response_format`` follows ``sample_rate`` (24000, 16000 or 8000: s16le PCM from the
        server; leave it "pcm") and its ``timestamps`` ``word_timestamps`` (leave it None).
        ``api_key``: one of the server's ``--api-keys``. ``word_timestamps``: push each word's
        timing with the audio (the ``aligned_transcript`` capability)."""
        if config.response_format != "pcm":
            raise ValueError("the LiveKit plugin takes raw PCM at sample_rate; leave StreamConfig.response_format "
                             f"at 'pcm', not {config.response_format!r}")
        if config.timestamps is not None:
            raise ValueError("the LiveKit plugin asks for word timestamps when word_timestamps is on; "
                             f"leave StreamConfig.timestamps at None, not {config.timestamps!r}")
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=word_timestamps),
                         sample_rate=sample_rate, num_channels=1)
        self._config = dataclasses.replace(config, response_format=pcm_format(sample_rate),
                                           timestamps="word" if word_timestamps else None)
        self._base_url = base_url
        self._api_key = api_key
        self._router: TurnRouter | None = None
        self._router_lock = asyncio.Lock()
        self._streams = weakref.WeakSet[SynthesizeStream]()
        self._prewarm_task: asyncio.Task | None = None

    @property
    def model(self) -> str:
        return self._config.model

    @property
    def provider(self) -> str:
        return "Chorus"

    async def _turn_router(self, timeout: float) -> TurnRouter:
        """The shared connection's router, (re)connecting when there is none or it closed."""
        async with self._router_lock:
            if self._router is None or self._router.closed is not None:
                try:
                    socket = await SpeechSocket.connect(self._base_url, self._config, api_key=self._api_key,
                                                        open_timeout=timeout)
                except ChorusError as e:
                    raise APIStatusError(str(e), status_code=e.event.status, body=e.event.code) from None
                except asyncio.TimeoutError:
                    raise APITimeoutError(f"no ready from {self._base_url} in {timeout} s") from None
                except (OSError, WebSocketException) as e:
                    raise APIConnectionError(f"cannot connect to {self._base_url}: {e!r}") from e
                self._router = TurnRouter(socket)
            return self._router

    def prewarm(self) -> None:
        """Open the connection now, so the first turn does not wait for it."""
        async def connect() -> None:
            try:
                await self._turn_router(DEFAULT_API_CONNECT_OPTIONS.timeout)
            except APIError as e:
                logger.warning("Chorus prewarm failed: %s", e)

        if self._prewarm_task is None or self._prewarm_task.done():
            self._prewarm_task = asyncio.create_task(connect(), name="chorus-prewarm")

    def synthesize(self, text: str, *,
                   conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        if self._prewarm_task is not None:
            await utils.aio.cancel_and_wait(self._prewarm_task)
        if self._router is not None:
            await self._router.aclose()
            self._router = None


class _SpokenText:
    """The turn's text, for its timed words: LiveKit's transcript is the concatenation of the
    ``TimedString``s, so each word takes the spacing before it in the text the turn sent (none
    between CJK characters). A word spoken differently from its text (``3`` said ``three``) is
    not found there; it gets a space before it, and the text it stands for is skipped over when
    the next word is found."""

    def __init__(self):
        self._unmatched = ""  # the pieces' text after the last word found
        self._piece_end: int | None = None
        self._started = False

    def add(self, piece: Piece) -> None:
        gap = " " if self._piece_end is not None and piece.char_start > self._piece_end else ""
        self._unmatched += gap + piece.text
        self._piece_end = piece.char_end

    def spaced(self, word: str) -> str:
        index = self._unmatched.find(word)
        if index < 0:
            before = " "
        else:
            before, self._unmatched = self._unmatched[:index], self._unmatched[index + len(word):]
            if before.strip():  # text spoken as other words, already pushed
                before = " "
        started, self._started = self._started, True
        return (before if started else "") + word


async def _receive(turn: Turn, output_emitter: tts.AudioEmitter, timeout: float) -> None:
    """Push the turn's audio (and its words' timings, when asked for) until its ``done``; once its
    text is flushed, each event must come within ``timeout`` s (before that, the turn may wait on
    the LLM for as long as it takes)."""
    events = turn.__aiter__()
    text = _SpokenText()
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.__anext__(), timeout if turn.flushed else None)
            except StopAsyncIteration:
                return
            if isinstance(event, Audio):
                output_emitter.push(event.data)
            elif isinstance(event, Piece):
                text.add(event)
            elif isinstance(event, Timestamps):  # after the piece's audio; seconds of the turn's audio
                output_emitter.push_timed_transcript(
                    [TimedString(text.spaced(word.text), start_time=word.start, end_time=word.end)
                     for word in event.items])
    except asyncio.TimeoutError:
        raise APITimeoutError(f"Chorus turn {turn.turn_id}: nothing for {timeout} s after flush") from None
    except ChorusError as e:
        raise APIStatusError(str(e), status_code=e.event.status, request_id=turn.turn_id, body=e.event.code) from None
    except ConnectionLost as e:
        raise APIConnectionError(str(e)) from None


async def _end(turn: Turn | None) -> None:
    """On every way out: a turn that has not ended is cancelled (barge-in or a failure)."""
    if turn is not None and not turn.ended.is_set():
        try:
            await turn.cancel()
        except Exception as e:  # the connection is gone: the server has dropped the turn already
            logger.debug("Chorus cancel of turn %s not sent: %r", turn.turn_id, e)


async def _open_turn(tts_: "TTS", conn_options: APIConnectOptions, output_emitter: tts.AudioEmitter, *,
                     stream: bool) -> Turn:
    """A new Chorus turn on the plugin's shared connection, and the emitter set up for its PCM."""
    router = await tts_._turn_router(conn_options.timeout)
    turn = router.open()
    output_emitter.initialize(request_id=turn.turn_id, sample_rate=tts_.sample_rate, num_channels=1,
                              mime_type="audio/pcm", stream=stream)
    return turn


class ChunkedStream(tts.ChunkedStream):
    """``synthesize(text)``: one turn with the whole text, flushed at once."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions):
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts
        self.turn: Turn | None = None

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        self.turn = turn = await _open_turn(self._tts, self._conn_options, output_emitter, stream=False)
        try:
            await turn.send_text(self._input_text)
            await turn.flush()
            await _receive(turn, output_emitter, self._conn_options.timeout)
        except WebSocketException as e:
            raise APIConnectionError(repr(e)) from e
        finally:
            await _end(turn)


class SynthesizeStream(tts.SynthesizeStream):
    """``stream()``: text pushed token by token is one turn; ``flush()`` or ``end_input()`` ends
    its text. ``turn`` is the Chorus turn of the current attempt (``turn.outcome`` tells how it
    ended: ``Done``, ``Cancelled``, an ``ErrorEvent`` or ``ConnectionLost``)."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions):
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self.turn: Turn | None = None

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        self.turn = turn = await _open_turn(self._tts, self._conn_options, output_emitter, stream=True)
        output_emitter.start_segment(segment_id=turn.turn_id)

        async def send() -> bool:
            sent = False
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    if sent:
                        break  # one segment per stream: its flush ends the turn
                    continue
                if not sent and not data.strip():
                    continue
                self._mark_started()
                await turn.send_text(data)
                sent = True
            if sent:
                await turn.flush()
            return sent

        send_task = asyncio.create_task(send(), name="chorus-send")
        receive_task = asyncio.create_task(_receive(turn, output_emitter, self._conn_options.timeout),
                                           name="chorus-receive")
        try:
            await asyncio.wait({send_task, receive_task}, return_when=asyncio.FIRST_COMPLETED)
            if send_task.done() and send_task.exception() is None and not send_task.result():
                return  # no text at all: the turn never opened on the server
            await asyncio.gather(send_task, receive_task)
        except WebSocketException as e:
            raise APIConnectionError(repr(e)) from e
        finally:
            await utils.aio.gracefully_cancel(send_task, receive_task)
            await _end(turn)
