"""The LiveKit plugin driven the way LiveKit Agents' ``tts_node`` drives a TTS (``async with
tts.stream()``, text pushed by a forwarding task, ``end_input()``, frames consumed until the
stream ends; an interruption cancels the consuming task, which closes the stream), against a real
server on loopback."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc  # noqa: E402
from livekit.agents import APIStatusError  # noqa: E402

from chorus.integrations import livekit as chorus_livekit  # noqa: E402
from chorus.integrations.ws_client import Cancelled, ConnectionLost, Done  # noqa: E402
from tests.integrations.conftest import INTERRUPTED_REPLY, KEY, LONG, REPLY, SHORT, ws_turns  # noqa: E402

WAIT_S = 20.0


def make_tts(server, config=SHORT, sample_rate: int = 24_000) -> chorus_livekit.TTS:
    return chorus_livekit.TTS(base_url=server.url, api_key=KEY, config=config, sample_rate=sample_rate)


async def tts_node(stream, tokens: list[str], *, end: bool = True, first_frame: asyncio.Event | None = None):
    """Agent.default.tts_node's loop: forward the text, yield the frames."""
    async def forward():
        for token in tokens:
            stream.push_text(token)
        if end:
            stream.end_input()

    forward_task = asyncio.create_task(forward())
    frames: list[rtc.AudioFrame] = []
    try:
        async for event in stream:
            frames.append(event.frame)
            if first_frame is not None:
                first_frame.set()
    finally:
        await forward_task
    return frames


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sample_rate", [24_000, 8_000])
def test_streamed_text_becomes_audio_frames(server, sample_rate):
    async def main():
        async with make_tts(server, sample_rate=sample_rate) as tts:
            async with tts.stream() as stream:
                frames = await asyncio.wait_for(tts_node(stream, REPLY), WAIT_S)
            return frames, stream.turn.outcome

    frames, outcome = asyncio.run(main())
    assert frames and all(f.sample_rate == sample_rate and f.num_channels == 1 for f in frames)
    assert isinstance(outcome, Done)
    heard = sum(f.duration for f in frames)
    assert heard == pytest.approx(outcome.audio_seconds, abs=0.02)  # every second the server sent


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
        async with make_tts(server, LONG) as tts:
            first_frame = asyncio.Event()
            stream = tts.stream()

            async def speak():  # the agent's speech task
                async with stream:
                    return await tts_node(stream, INTERRUPTED_REPLY, end=False, first_frame=first_frame)

            speech = asyncio.create_task(speak())
            await asyncio.wait_for(first_frame.wait(), WAIT_S)
            assert server.pipeline.active_requests > 0, "the turn had no audio left to stop; make it longer"
            speech.cancel()  # the user barges in: the session cancels the speech, the stream closes
            await asyncio.gather(speech, return_exceptions=True)
            await asyncio.wait_for(stream.turn.ended.wait(), WAIT_S)
            router = tts._router
            # the connection outlives the barge-in: the next reply goes over it
            async with tts.stream() as following:
                frames = await asyncio.wait_for(tts_node(following, REPLY), WAIT_S)
            return stream, router, following, frames

    stream, router, following, frames = asyncio.run(main())
    assert isinstance(stream.turn.outcome, Cancelled) and stream.turn.cancel_sent
    # no audio of the cancelled turn after `cancelled` (the socket checks every frame), so the
    # connection was not dropped for a protocol error, and the next turn used it
    assert following.turn._router is router and isinstance(following.turn.outcome, Done) and frames
    assert ws_turns(server, "cancelled") == cancelled_before + 1
    server.wait_idle()


@pytest.mark.timeout(60)
def test_the_next_stream_reconnects_after_the_server_closed_an_idle_connection(idle_server):
    async def main():
        async with make_tts(idle_server) as tts:
            async with tts.stream() as stream:
                first = await asyncio.wait_for(tts_node(stream, REPLY), WAIT_S)
            closed = await asyncio.wait_for(tts._router.wait_closed(), WAIT_S)
            async with tts.stream() as stream:
                second = await asyncio.wait_for(tts_node(stream, REPLY), WAIT_S)
            return first, closed, second

    first, closed, second = asyncio.run(main())
    assert isinstance(closed, ConnectionLost) and closed.close_code == 1000 and closed.error.code == "idle_timeout"
    assert first and second
