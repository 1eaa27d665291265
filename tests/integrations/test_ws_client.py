"""The plugins' shared WebSocket client against a real server: refusals become ``ChorusError``s
with the server's status, several turns on one socket reach their own iterators, and asked-for
timestamps come as ``Timestamps`` events after their audio."""
from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from websockets.asyncio.client import connect as websocket_connect

from chorus.integrations.ws_client import (
    Audio, ChorusError, Chunking, ConnectionLost, Done, Piece, ProtocolError, SpeechSocket, StreamConfig, Timestamps,
    TurnRouter, parse_audio_frame, parse_event, stream_url,
)
from tests.integrations.conftest import KEY, REPLY, SHORT

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


# a piece per sentence of REPLY, so a turn has several pieces and several timestamps events
PIECES = Chunking(min_chars=10, max_chars=40, max_wait_ms=60_000)


def timed(timestamps: str | None) -> StreamConfig:
    return dataclasses.replace(SHORT, timestamps=timestamps, chunking=PIECES)


async def _speak(socket: SpeechSocket, tokens: list[str] = REPLY):
    """One turn of ``tokens`` on ``socket``: the turn and its events, in the order they came."""
    router = TurnRouter(socket)
    turn = router.open()
    for token in tokens:
        await turn.send_text(token)
    await turn.flush()
    events = await asyncio.wait_for(_events(turn), WAIT_S)
    await router.aclose()
    return turn, events


async def _events(turn):
    return [event async for event in turn]


def speak(server, config: StreamConfig):
    async def main():
        async with await SpeechSocket.connect(server.url, config, api_key=KEY) as socket:
            return await _speak(socket)

    return asyncio.run(main())


@pytest.mark.timeout(60)
def test_word_timestamps_cover_the_turns_words_in_order_inside_its_audio(server):
    turn, events = speak(server, timed("word"))
    stamps = [e for e in events if isinstance(e, Timestamps)]
    assert len(stamps) > 1 and [s.piece for s in stamps] == list(range(len(stamps)))
    assert all(s.turn_id == turn.turn_id and s.unit == "word" and s.method == "estimate" for s in stamps)
    words = [w for s in stamps for w in s.items]
    assert [w.text for w in words] == "".join(REPLY).split()
    ended = 0.0
    for word in words:  # monotonic, of positive length, inside the turn's audio
        assert ended <= word.start < word.end <= turn.outcome.audio_seconds + 1e-4
        ended = word.end


@pytest.mark.timeout(60)
def test_a_pieces_timestamps_come_after_its_audio(server):
    _, events = speak(server, timed("word"))
    heard, checked = 0.0, 0
    for event in events:
        if isinstance(event, Audio):
            heard += len(event.data) / 2 / 24_000
        elif isinstance(event, Timestamps):
            assert event.items[-1].end <= heard + 1e-4  # the audio it times was yielded before it
            checked += 1
    assert checked > 1


@pytest.mark.timeout(60)
def test_character_timestamps_spell_each_piece(server):
    _, events = speak(server, timed("character"))
    pieces = [e.text.strip() for e in events if isinstance(e, Piece)]
    stamps = [e for e in events if isinstance(e, Timestamps)]
    assert len(stamps) == len(pieces) > 1 and all(s.unit == "character" for s in stamps)
    for index, (stamp, text) in enumerate(zip(stamps, pieces)):
        assert "".join(c.text for c in stamp.items) == (" " if index else "") + text


@pytest.mark.timeout(60)
def test_without_timestamps_no_timestamps_event_comes(server):
    turn, events = speak(server, timed(None))
    assert isinstance(turn.outcome, Done) and any(isinstance(e, Audio) for e in events)
    assert not [e for e in events if isinstance(e, Timestamps)]


def test_a_bad_timestamps_value_is_a_value_error_before_connecting():
    with pytest.raises(ValueError, match="timestamps must be None .off., 'word' or 'character', not 'sentence'"):
        StreamConfig(model="chatterbox-turbo", timestamps="sentence")


@pytest.mark.parametrize("lists", [{"words": ["a"], "start": [0.0], "end": []},
                                   {"words": ["a"], "start": ["0"], "end": [0.1]},
                                   {"words": [1], "start": [0.0], "end": [0.1]}, ["a"]])
def test_a_timestamps_event_without_parallel_lists_is_a_protocol_error(lists):
    body = {"type": "timestamps", "turn_id": "t", "piece": 0, "method": "estimate", "word_timestamps": lists}
    with pytest.raises(ProtocolError, match="word_timestamps"):
        parse_event(json.dumps(body))


@pytest.mark.timeout(60)
def test_timestamps_the_config_did_not_ask_for_are_a_protocol_error(server):
    async def main():
        # the server is asked for words; the client is told its config asked for none
        websocket = await websocket_connect(stream_url(server.url),
                                            additional_headers={"Authorization": f"Bearer {KEY}"})
        await websocket.send(json.dumps(timed("word").message()))
        socket = SpeechSocket(websocket, parse_event(await websocket.recv()), timestamps=None)
        async with socket:
            await _speak(socket)

    with pytest.raises(ConnectionLost, match="word timestamps on a connection that asked for None"):
        asyncio.run(main())
