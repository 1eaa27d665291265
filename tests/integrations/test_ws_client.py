"""The plugins' shared WebSocket client against a real server: refusals become ``ChorusError``s
with the server's status, and several turns on one socket reach their own iterators."""
from __future__ import annotations

import asyncio
import json

import pytest

from chorus.integrations.ws_client import (
    Audio, ChorusError, Done, Piece, ProtocolError, SpeechSocket, StreamConfig, TurnRouter, parse_audio_frame,
    stream_url,
)
from tests.integrations.conftest import KEY, SHORT

WAIT_S = 20.0


def test_the_stream_url_is_derived_from_the_server_url():
    assert stream_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/v1/audio/speech/stream"
    assert stream_url("https://tts.example/v1/") == "wss://tts.example/v1/audio/speech/stream"
    assert stream_url("ws://proxy:9000/chorus/stream") == "ws://proxy:9000/chorus/stream"
    with pytest.raises(ValueError, match="base_url"):
        stream_url("localhost:8000")


def test_a_binary_frame_is_header_length_json_header_then_audio():
    header = json.dumps({"turn_id": "t1", "seq": 3}).encode()
    assert parse_audio_frame(len(header).to_bytes(2, "big") + header + b"\x01\x02") == Audio("t1", 3, b"\x01\x02")
    with pytest.raises(ProtocolError, match="header"):
        parse_audio_frame((200).to_bytes(2, "big") + header)


@pytest.mark.parametrize("header", [b"[1]", b'{"turn_id": "t", "seq": -1}', b'{"turn_id": "t", "seq": true}',
                                    b'{"turn_id": 7, "seq": 0}', b"\xff{}"])
def test_a_binary_frame_with_a_malformed_header_is_a_protocol_error(header):
    with pytest.raises(ProtocolError):
        parse_audio_frame(len(header).to_bytes(2, "big") + header + b"\x00\x00")
    with pytest.raises(ProtocolError):
        parse_audio_frame(b"\x00")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api_key", [None, "not-the-key"])
def test_a_missing_or_wrong_key_is_refused_with_401(server, api_key):
    async def main():
        await SpeechSocket.connect(server.url, SHORT, api_key=api_key)

    with pytest.raises(ChorusError) as refused:
        asyncio.run(main())
    assert refused.value.event.status == 401 and refused.value.event.code == "invalid_api_key"


@pytest.mark.timeout(60)
def test_a_bad_config_is_refused_naming_the_field(server):
    async def main():
        await SpeechSocket.connect(server.url, StreamConfig(model="chatterbox-turbo", exaggeration=9.0), api_key=KEY)

    with pytest.raises(ChorusError) as refused:
        asyncio.run(main())
    assert refused.value.event.status == 400 and "exaggeration" in refused.value.event.message


@pytest.mark.timeout(60)
def test_turns_on_one_socket_reach_their_own_iterators(server):
    async def speak(router: TurnRouter, words: list[str]):
        turn = router.open()
        for word in words:
            await turn.send_text(word)
        await turn.flush()
        events = [event async for event in turn]
        return turn, events

    async def main():
        async with await SpeechSocket.connect(server.url, SHORT, api_key=KEY) as socket:
            router = TurnRouter(socket)
            first, second = await asyncio.wait_for(asyncio.gather(
                speak(router, ["Good ", "morning, ", "everyone."]),
                speak(router, ["The weather ", "is fine ", "today."])), WAIT_S)
            return socket.sample_rate, first, second

    rate, *turns = asyncio.run(main())
    assert rate == 24_000
    for turn, events in turns:
        audio = [e for e in events if isinstance(e, Audio)]
        assert isinstance(turn.outcome, Done) and audio and all(e.turn_id == turn.turn_id for e in events)
        assert [e.seq for e in audio] == list(range(len(audio)))
        assert sum(len(e.data) for e in audio) / 2 / rate == pytest.approx(turn.outcome.audio_seconds, abs=1e-3)
        assert [e.text for e in events if isinstance(e, Piece)]
