"""A Pipecat TTS service over the Chorus voice-agent WebSocket (``pip install 'chorus-tts[pipecat]'``)::

    from chorus.integrations.pipecat import ChorusTTSService
    from chorus.integrations.ws_client import StreamConfig

    tts = ChorusTTSService(base_url="http://localhost:8000",
                           config=StreamConfig(model="chatterbox-turbo", voice="default"))
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), ...])

One WebSocket per service; each Pipecat turn context is one Chorus turn (its ``turn_id`` is
the context id). LLM tokens go to the server as they come (``TextAggregationMode.TOKEN`` by
default: the server's text threshold decides when a piece is spoken), the end of the LLM
reply is the turn's ``flush``, and an interruption sends ``cancel`` for every open context;
audio of an interrupted context that is still in flight is dropped. The pipeline's output rate
picks the PCM format (24, 16 or 8 kHz from the server; other rates are resampled from 24 kHz).
The connection config is sticky, so a settings update of model, voice or language reconnects.
With ``word_timestamps`` (on, as in Pipecat's own Cartesia and ElevenLabs services) the connection
asks for word timestamps and the service pushes each spoken word as a ``TTSTextFrame`` whose
presentation time is the turn's first audio plus the word's start, instead of the LLM's text
once its audio is out.
"""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.transcriptions.language import Language
from websockets.exceptions import ConnectionClosedOK
from websockets.protocol import State

from chorus.integrations.ws_client import (
    PCM_FORMATS, Audio, ChorusError, Done, ErrorEvent, SpeechSocket, StreamConfig, Timestamps,
)

_SOURCE_RATE = 24_000  # what the server sends when the pipeline's rate is not one of PCM_FORMATS
# connection-level errors that only say why the server closes a socket that has nothing in flight:
# the next turn opens a new connection
_BENIGN_CLOSE = {"idle_timeout", "shutting_down"}
# languages whose words (one character each, with the punctuation after it) carry their own
# spacing: no space is put between their TTSTextFrames (Pipecat's Cartesia service does the same)
_UNSPACED_LANGUAGES = {"zh", "ja"}


class ChorusTTSService(WebsocketTTSService):
    """Text in as it streams from the LLM, audio frames out, over ``WS /v1/audio/speech/stream``."""

    def __init__(self, *, config: StreamConfig, base_url: str = "http://127.0.0.1:8000",
                 api_key: str | None = None, open_timeout: float = 10.0,
                 text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
                 word_timestamps: bool = True, **kwargs):
        """``config``: the connection's model, voice and Chatterbox fields; its
        ``response_format`` is chosen from the pipeline's output rate (leave it "pcm") and its
        ``timestamps`` from ``word_timestamps`` (leave it None). ``api_key``: one of the server's
        ``--api-keys``. ``word_timestamps``: push each word as a ``TTSTextFrame`` at the time it
        is spoken (off: the text of each piece after its audio). Other arguments go to Pipecat's
        ``WebsocketTTSService`` (e.g. ``sample_rate``)."""
        if config.response_format != "pcm":
            raise ValueError("ChorusTTSService picks the PCM format from the pipeline's sample rate; "
                             f"leave StreamConfig.response_format at 'pcm', not {config.response_format!r}")
        if config.timestamps is not None:
            raise ValueError("ChorusTTSService asks for word timestamps when word_timestamps is on; "
                             f"leave StreamConfig.timestamps at None, not {config.timestamps!r}")
        settings = TTSSettings(model=config.model, voice=config.voice, language=config.language)
        super().__init__(settings=settings, text_aggregation_mode=text_aggregation_mode,
                         push_text_frames=not word_timestamps, push_start_frame=True, pause_frame_processing=False,
                         **kwargs)
        self._config = config
        self._word_timestamps = word_timestamps
        self._base_url = base_url
        self._api_key = api_key
        self._open_timeout = open_timeout
        self._socket: SpeechSocket | None = None
        self._receive_task = None
        self._live_turns: set[str] = set()  # text sent on this socket, no done/error/cancel yet
        self._odd_byte: dict[str, bytes] = {}  # a sample split across two frames, per turn

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        return str(language.value).split("-")[0]  # the server takes ISO 639-1 codes

    # --- connection -----------------------------------------------------------------------

    def _stream_config(self) -> StreamConfig:
        rate = self.sample_rate if self.sample_rate in PCM_FORMATS else _SOURCE_RATE
        language = self._settings.language
        return dataclasses.replace(self._config, model=self._settings.model, voice=self._settings.voice,
                                   language=language if isinstance(language, str) else None,
                                   response_format=PCM_FORMATS[rate],
                                   timestamps="word" if self._word_timestamps else None)

    async def start(self, frame: StartFrame):
        await super().start(frame)
        await self._connect()

    def _connected(self) -> bool:
        return self._websocket is not None and self._websocket.state is State.OPEN

    async def _connect(self):
        await super()._connect()
        await self._connect_websocket()
        if self._connected() and (self._receive_task is None or self._receive_task.done()):
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self):
        await super()._disconnect()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self):
        if self._connected():
            return
        try:
            logger.debug(f"{self}: connecting to Chorus at {self._base_url}")
            self._socket = await SpeechSocket.connect(self._base_url, self._stream_config(), api_key=self._api_key,
                                                      open_timeout=self._open_timeout,
                                                      connect=self._websocket_connect)
            self._websocket = self._socket.websocket
            self._live_turns.clear()
            self._odd_byte.clear()
            await self._call_event_handler("on_connected")
        except ChorusError as e:
            # 4xx (a bad key or config) will not get better by retrying: the service is unusable.
            permanent = 400 <= e.event.status < 500 and e.event.status != 429
            await self.push_error(error_msg=f"Chorus refused the connection: {e}", exception=e,
                                  force_treat_as_permanent=permanent)
            self._socket = self._websocket = None
            await self._call_event_handler("on_connection_error", str(e))
        except Exception as e:
            await self.push_error(error_msg=f"cannot connect to Chorus at {self._base_url}: {e!r}", exception=e)
            self._socket = self._websocket = None
            await self._call_event_handler("on_connection_error", repr(e))

    async def _disconnect_websocket(self):
        try:
            await self.stop_all_metrics()
            if self._socket:
                logger.debug(f"{self}: disconnecting from Chorus")
                await self._socket.aclose()
        finally:
            self._socket = self._websocket = None
            self._live_turns.clear()
            await self._call_event_handler("on_disconnected")

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        changed = await super()._update_settings(delta)
        if changed.keys() & {"model", "voice", "language"} and self._socket is not None:
            await self._disconnect()  # the config is sticky per connection
            await self._connect()
        return changed

    # --- receiving ------------------------------------------------------------------------

    async def _receive_messages(self):
        # A normal close (1000: idle timeout; 1001: the server drains) raises ConnectionClosedOK,
        # which ends the base class's receive loop without reconnecting: the next turn reconnects.
        # Other closes raise ConnectionClosedError and the base class reconnects with backoff.
        assert self._socket is not None
        try:
            while True:
                await self._handle_event(await self._socket.receive())
        except ConnectionClosedOK:
            await self._call_event_handler("on_disconnected")
            raise

    async def _handle_event(self, event) -> None:
        if isinstance(event, Audio):
            if self.audio_context_available(event.turn_id):
                await self._push_audio(event)
        elif isinstance(event, Done):
            self._end_turn(event.turn_id)
            if self.audio_context_available(event.turn_id):
                await self.stop_ttfb_metrics()
                await self.append_to_audio_context(event.turn_id, TTSStoppedFrame(context_id=event.turn_id))
                await self.remove_audio_context(event.turn_id)
        elif isinstance(event, Timestamps):
            # after the piece's audio in its context's queue: Pipecat times each word from the
            # context's first audio (the turn's, as Chorus's times are) and drops those of a
            # context that is gone (interrupted)
            language = self._settings.language
            unspaced = isinstance(language, str) and language.split("-")[0] in _UNSPACED_LANGUAGES
            await self.add_word_timestamps([(word.text, word.start) for word in event.items], event.turn_id,
                                           includes_inter_frame_spaces=True if unspaced else None)
        elif isinstance(event, ErrorEvent):
            await self._handle_error(event)
        # Piece: when text went to synthesis; Cancelled: the context is gone already.

    async def _push_audio(self, event: Audio) -> None:
        data = self._odd_byte.pop(event.turn_id, b"") + event.data
        if len(data) % 2:
            data, self._odd_byte[event.turn_id] = data[:-1], data[-1:]
        if not data:
            return
        if self._socket is not None and self._socket.sample_rate != self.sample_rate:
            data = await self._resampler.resample(data, self._socket.sample_rate, self.sample_rate)
        await self.append_to_audio_context(
            event.turn_id, TTSAudioRawFrame(data, self.sample_rate, 1, context_id=event.turn_id))

    async def _handle_error(self, event: ErrorEvent) -> None:
        if event.turn_id is None:
            if event.code in _BENIGN_CLOSE:
                logger.info(f"{self}: Chorus closes the connection: {event.code}")
            else:
                await self.push_error(error_msg=f"Chorus: {event.code} ({event.status}): {event.message}")
            return
        self._end_turn(event.turn_id)
        await self.push_error(error_msg=f"Chorus turn {event.turn_id}: {event.code} ({event.status}): {event.message}")
        if self.audio_context_available(event.turn_id):
            await self.stop_all_metrics()
            await self.append_to_audio_context(event.turn_id, TTSStoppedFrame(context_id=event.turn_id))
            await self.remove_audio_context(event.turn_id)

    def _end_turn(self, turn_id: str) -> None:
        self._live_turns.discard(turn_id)
        self._odd_byte.pop(turn_id, None)

    # --- turns ----------------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send ``text`` as a delta of turn ``context_id``; its audio arrives on the receive task."""
        if not self._connected():
            await self._connect()
        if self._socket is None:
            yield ErrorFrame(error=f"{self}: not connected to Chorus at {self._base_url}")
            return
        try:
            await self._socket.send_text(context_id, text)
        except Exception as e:
            yield ErrorFrame(error=f"{self}: sending text to Chorus failed: {e!r}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        self._live_turns.add(context_id)
        if not self._is_streaming_tokens:
            await self.start_tts_usage_metrics(text)
        yield None

    async def flush_audio(self, context_id: str | None = None):
        """The end of the turn's text: the server speaks what it holds, then sends ``done``."""
        turn_id = context_id or self.get_active_audio_context_id()
        if turn_id in self._live_turns and self._connected():
            await self._socket.flush(turn_id)

    async def on_audio_context_interrupted(self, context_id: str):
        """Barge-in: ``cancel`` the turn; the server drops its text, requests and unsent audio."""
        await self.stop_all_metrics()
        if context_id in self._live_turns and self._connected():
            self._end_turn(context_id)
            try:
                await self._socket.cancel(context_id)
            except Exception as e:  # the connection is going away: the server cancels it anyway
                logger.warning(f"{self}: cancel of turn {context_id} not sent: {e!r}")
        await super().on_audio_context_interrupted(context_id)
