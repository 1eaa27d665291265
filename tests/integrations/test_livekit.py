"""The LiveKit plugin in LiveKit Agents' own ``AgentSession``, against a real server on loopback:
the session speaks streamed text (``session.say`` with an async iterable, as an LLM's tokens
come) through its default ``tts_node`` into an audio output the test provides, and a
``session.interrupt()`` (what a user starting to speak causes) cancels the turn. No room, STT,
VAD or LLM: the session's TTS path is what runs."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from tests.integrations.conftest import (
    INTERRUPTED_REPLY, KEY, LONG, REPLY, SHORT, import_framework, ws_turns,
)

import_framework("livekit.agents.voice")

from livekit import rtc  # noqa: E402
from livekit.agents import Agent, AgentSession, APIStatusError  # noqa: E402
from livekit.agents.types import TimedString  # noqa: E402
from livekit.agents.voice import io as lk_io  # noqa: E402

from chorus.integrations import livekit as chorus_livekit  # noqa: E402
from chorus.integrations.ws_client import Cancelled, ConnectionLost, Done, Piece  # noqa: E402

WAIT_S = 20.0


class ObservedTTS(chorus_livekit.TTS):
    """The plugin, keeping the streams the session opens (each one is a Chorus turn)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.streams: list[chorus_livekit.SynthesizeStream] = []

    def stream(self, **kwargs) -> chorus_livekit.SynthesizeStream:
        stream = super().stream(**kwargs)
        self.streams.append(stream)
        return stream


class Speaker(lk_io.AudioOutput):
    """The session's audio output: a loudspeaker that plays each frame the moment it comes and
    keeps it. Each segment (one speech's audio, ended by ``flush()``) is a list of frames."""

    def __init__(self):
        super().__init__(label="test-speaker", capabilities=lk_io.AudioOutputCapabilities(pause=False))
        self.segments: list[list[rtc.AudioFrame]] = []
        self.heard = asyncio.Event()  # set at the first frame
        self._playing: list[rtc.AudioFrame] | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self._playing is None:
            self._playing = []
            self.segments.append(self._playing)
            self.on_playback_started(created_at=time.time())
        self._playing.append(frame)
        self.heard.set()

    def flush(self) -> None:
        super().flush()
        if self._playing is not None:
            played, self._playing = sum(f.duration for f in self._playing), None
            self.on_playback_finished(playback_position=played, interrupted=False)

    def clear_buffer(self) -> None:
        pass  # every frame was played as it came: nothing is buffered


class Transcript(lk_io.TextOutput):
    """The session's transcription output: every text delta it captures, in order."""

    def __init__(self):
        super().__init__(label="test-transcript", next_in_chain=None)
        self.texts: list[str] = []

    async def capture_text(self, text: str) -> None:
        self.texts.append(text)

    def flush(self) -> None:
        pass


def make_tts(server, config=SHORT, sample_rate: int = 24_000, **options) -> ObservedTTS:
    return ObservedTTS(base_url=server.url, api_key=KEY, config=config, sample_rate=sample_rate, **options)


@contextlib.asynccontextmanager
async def agent_session(tts: ObservedTTS, transcript: Transcript | None = None,
                        **options) -> AsyncIterator[tuple[AgentSession, Speaker]]:
    """A started ``AgentSession`` (``options``) whose only model is the plugin, speaking into a
    ``Speaker`` and writing its transcript into ``transcript``."""
    speaker = Speaker()
    async with tts:
        session = AgentSession(tts=tts, **options)
        session.output.audio = speaker
        session.output.transcription = transcript
        await session.start(Agent(instructions="Say what you are given."), record=False)
        try:
            yield session, speaker
        finally:
            await session.aclose()


async def llm_tokens(tokens: list[str], *, still_talking: asyncio.Event | None = None) -> AsyncIterator[str]:
    """An LLM's reply as it streams; with ``still_talking``, the reply goes on until it is set."""
    for token in tokens:
        yield token
    if still_talking is not None:
        await still_talking.wait()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sample_rate", [24_000, 8_000])
def test_the_session_speaks_streamed_text_into_its_audio_output(server, sample_rate):
    async def main():
        tts = make_tts(server, sample_rate=sample_rate)
        async with agent_session(tts) as (session, speaker):
            speech = session.say(llm_tokens(REPLY))
            await asyncio.wait_for(speech.wait_for_playout(), WAIT_S)
        return speech, speaker, tts.streams

    speech, speaker, streams = asyncio.run(main())
    assert speech.exception() is None and not speech.interrupted
    [frames] = speaker.segments
    assert frames and all(f.sample_rate == sample_rate and f.num_channels == 1 for f in frames)
    [stream] = streams  # the whole reply is one Chorus turn
    assert isinstance(stream.turn.outcome, Done)
    heard = sum(f.duration for f in frames)
    assert heard == pytest.approx(stream.turn.outcome.audio_seconds, abs=0.02)  # every second the server sent


@pytest.mark.timeout(60)
def test_synthesize_speaks_the_whole_text(server):
    async def main():
        async with make_tts(server) as tts:
            return await asyncio.wait_for(tts.synthesize("Hello there, how are you today?").collect(), WAIT_S)

    frame = asyncio.run(main())
    assert frame.sample_rate == 24_000 and frame.duration > 0.2


@pytest.mark.timeout(60)
def test_a_wrong_key_fails_at_once_without_retries(server):
    async def main():
        tts = chorus_livekit.TTS(base_url=server.url, api_key="not-the-key", config=SHORT)
        async with tts:
            return await asyncio.wait_for(tts.synthesize("Hello there.").collect(), WAIT_S)

    with pytest.raises(APIStatusError) as refused:
        asyncio.run(main())
    assert refused.value.status_code == 401 and not refused.value.retryable


@pytest.mark.timeout(60)
def test_an_interruption_cancels_the_turn_and_stops_its_audio(server):
    cancelled_before = ws_turns(server, "cancelled")

    async def main():
        tts = make_tts(server, LONG)
        async with agent_session(tts) as (session, speaker):
            interrupted = session.say(llm_tokens(INTERRUPTED_REPLY, still_talking=asyncio.Event()))
            await asyncio.wait_for(speaker.heard.wait(), WAIT_S)
            assert server.pipeline.active_requests > 0, "the turn had no audio left to stop; make it longer"
            await asyncio.wait_for(session.interrupt(), WAIT_S)  # the user barges in
            [stream] = tts.streams
            await asyncio.wait_for(stream.turn.ended.wait(), WAIT_S)
            router = tts._router
            # the connection outlives the barge-in: the next reply goes over it
            following = session.say(llm_tokens(REPLY))
            await asyncio.wait_for(following.wait_for_playout(), WAIT_S)
        return interrupted, following, tts.streams, router, speaker

    interrupted, following, (stream, next_stream), router, speaker = asyncio.run(main())
    assert interrupted.interrupted and not following.interrupted
    assert isinstance(stream.turn.outcome, Cancelled) and stream.turn.cancel_sent
    # no audio of the cancelled turn after `cancelled` (the socket checks every frame), so the
    # connection was not dropped for a protocol error, and the next turn used it
    assert next_stream.turn._router is router and isinstance(next_stream.turn.outcome, Done)
    assert len(speaker.segments) == 2 and speaker.segments[1]
    assert ws_turns(server, "cancelled") == cancelled_before + 1
    server.wait_idle()


@pytest.mark.timeout(60)
def test_the_next_reply_reconnects_after_the_server_closed_an_idle_connection(idle_server):
    async def main():
        tts = make_tts(idle_server)
        async with agent_session(tts) as (session, speaker):
            await asyncio.wait_for(session.say(llm_tokens(REPLY)).wait_for_playout(), WAIT_S)
            closed = await asyncio.wait_for(tts._router.wait_closed(), WAIT_S)
            await asyncio.wait_for(session.say(llm_tokens(REPLY)).wait_for_playout(), WAIT_S)
        return closed, speaker, tts.streams

    closed, speaker, streams = asyncio.run(main())
    assert isinstance(closed, ConnectionLost) and closed.close_code == 1000 and closed.error.code == "idle_timeout"
    assert len(speaker.segments) == 2 and all(speaker.segments)
    assert [type(s.turn.outcome) for s in streams] == [Done, Done]


def transcribe_reply(server, **options) -> tuple[Transcript, list[list[rtc.AudioFrame]]]:
    """One reply spoken by a session that takes the TTS's aligned transcript: what it transcribed
    and the audio it played."""
    async def main():
        transcript = Transcript()
        async with agent_session(make_tts(server, **options), transcript,
                                 use_tts_aligned_transcript=True) as (session, speaker):
            await asyncio.wait_for(session.say(llm_tokens(REPLY)).wait_for_playout(), WAIT_S)
        return transcript, speaker.segments

    return asyncio.run(main())


@pytest.mark.timeout(60)
def test_the_aligned_transcript_is_the_words_timed_inside_the_turns_audio(server):
    transcript, segments = transcribe_reply(server)
    assert transcript.texts and all(isinstance(t, TimedString) for t in transcript.texts)
    assert "".join(transcript.texts) == "".join(REPLY)  # the words, spaced as the reply was
    heard = sum(f.duration for f in segments[0])
    ended = 0.0
    for word in transcript.texts:  # monotonic, of positive length, inside the audio played
        assert ended <= word.start_time < word.end_time <= heard + 1e-3
        ended = word.end_time


@pytest.mark.timeout(60)
def test_without_word_timestamps_the_transcript_is_the_untimed_text(server):
    transcript, _ = transcribe_reply(server, word_timestamps=False)
    assert "".join(transcript.texts) == "".join(REPLY)
    assert not [t for t in transcript.texts if isinstance(t, TimedString)]


def spaced(pieces: list[tuple[int, str]], words: list[str]) -> list[str]:
    """The transcript strings of ``words`` spoken from ``pieces`` ((char_start, text) each)."""
    text = chorus_livekit._SpokenText()
    for start, piece in pieces:
        text.add(Piece("t", 0, piece, start, start + len(piece)))
    return [text.spaced(word) for word in words]


@pytest.mark.parametrize("pieces, words, strings", [
    ([(0, "Hello there,"), (13, "how are you?")], ["Hello", "there,", "how", "are", "you?"],
     ["Hello", " there,", " how", " are", " you?"]),  # the space between two pieces too
    ([(0, "你好。"), (3, "谢谢。")], ["你", "好。", "谢", "谢。"],
     ["你", "好。", "谢", "谢。"]),  # no space in CJK text
    ([(0, "I have 3 cats.")], ["I", "have", "three", "cats."], ["I", " have", " three", " cats."]),
])
def test_timed_words_take_the_spacing_of_the_turns_text(pieces, words, strings):
    assert spaced(pieces, words) == strings
