"""Timestamps on the voice-agent WebSocket (``timestamps`` in ``config``, docs/voice-agents.md):
a ``timestamps`` event after each piece's audio, in seconds of the turn's audio, covering the
turn's words and naming its method (estimate on Turbo, alignment on an original T3 with the
alignment heads); characters on request; none when off; a bad value refused; none for audio a
cancelled turn did not send."""
from __future__ import annotations

import pytest

from tests.server.live import LiveServer, aligned_live_server, server_config, tiny_loader
from tests.server.ws_client import configure, connect, next_message, send

pytestmark = pytest.mark.timeout(120)

TEXT = "Hello there, this is a test. It has two sentences. And a third one ends it."
CHUNKING = {"min_chars": 10, "max_chars": 40, "max_wait_ms": 60_000}  # a piece per sentence
BYTES_PER_SECOND = 2 * 24_000  # pcm: 16-bit at 24 kHz


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), canary_interval_s=3600.0)
    with LiveServer(config, tiny_loader(config)) as live:
        yield live


def _speak(ws, text: str = TEXT) -> list:
    """Every message of one turn, in the order they came, up to its ``done``."""
    send(ws, type="text", turn_id="t", text=text)
    send(ws, type="flush", turn_id="t")
    messages = []
    while not (messages and isinstance(messages[-1], dict) and messages[-1]["type"] in ("done", "error")):
        messages.append(next_message(ws))
    assert messages[-1]["type"] == "done", messages[-1]
    return messages


def _timestamps_with_audio_before(messages) -> list[tuple[dict, float]]:
    """Each ``timestamps`` event with the seconds of audio the turn had sent before it."""
    sent, out = 0, []
    for message in messages:
        if isinstance(message, tuple):
            sent += len(message[1])
        elif message["type"] == "timestamps":
            out.append((message, sent / BYTES_PER_SECOND))
    return out


def test_word_timestamps_cover_the_turns_words_in_order_inside_its_audio(server):
    with connect(server) as ws:
        configure(ws, timestamps="word", chunking=CHUNKING, seed=5)
        messages = _speak(ws)
    events = [e for e, _ in _timestamps_with_audio_before(messages)]
    assert len(events) > 1 and [e["piece"] for e in events] == list(range(len(events)))
    assert all(e["turn_id"] == "t" and e["method"] == "estimate" for e in events)
    words = [w for e in events for w in e["word_timestamps"]["words"]]
    assert words == TEXT.split()
    duration = messages[-1]["audio_seconds"]
    ended = 0.0
    for event in events:
        timed = event["word_timestamps"]
        assert len(timed["start"]) == len(timed["end"]) == len(timed["words"])
        for start, end in zip(timed["start"], timed["end"]):  # monotonic, positive, inside the audio
            assert ended <= start < end <= duration + 1e-4
            ended = end


def test_each_pieces_timestamps_follow_its_audio_and_the_next_piece_continues_them(server):
    with connect(server) as ws:
        configure(ws, timestamps="word", chunking=CHUNKING, seed=5)
        timed = _timestamps_with_audio_before(_speak(ws))
    assert len(timed) > 1
    before = 0.0  # the audio sent before the piece: where its times start
    for event, sent in timed:
        starts, ends = event["word_timestamps"]["start"], event["word_timestamps"]["end"]
        assert starts[0] >= before - 1e-4 and ends[-1] <= sent + 1e-4  # its audio all went out before it
        before = sent


def test_character_timestamps_spell_each_piece(server):
    with connect(server) as ws:
        configure(ws, timestamps="character", chunking=CHUNKING, seed=5)
        messages = _speak(ws)
    pieces = [m["text"] for m in messages if isinstance(m, dict) and m["type"] == "piece"]
    events = [e for e, _ in _timestamps_with_audio_before(messages)]
    assert len(events) == len(pieces) > 1 and all("word_timestamps" not in e for e in events)
    for index, (event, text) in enumerate(zip(events, pieces)):
        timed = event["character_timestamps"]
        assert "".join(timed["characters"]) == (" " if index else "") + text.strip()
        assert timed["start"] == sorted(timed["start"]) and all(s <= e for s, e in zip(timed["start"], timed["end"]))


def test_timestamps_are_off_by_default(server):
    with connect(server) as ws:
        configure(ws, chunking=CHUNKING, seed=5)
        messages = _speak(ws)
    assert any(isinstance(m, tuple) for m in messages)
    assert not [m for m in messages if isinstance(m, dict) and m["type"] == "timestamps"]


def test_an_original_model_with_the_alignment_heads_names_alignment(module_tmp_path_factory):
    with aligned_live_server(module_tmp_path_factory.mktemp("voices-original"), canary_interval_s=3600.0) as live:
        with connect(live) as ws:
            configure(ws, model="chatterbox-original", timestamps="word", chunking=CHUNKING, seed=5)
            events = [e for e, _ in _timestamps_with_audio_before(_speak(ws))]
    assert events and all(e["method"] == "alignment" for e in events)
    assert [w for e in events for w in e["word_timestamps"]["words"]] == TEXT.split()


def test_a_bad_timestamps_value_is_refused_naming_the_field(server):
    with connect(server) as ws:
        send(ws, type="config", model="chatterbox-turbo", timestamps="sentence")
        error = next_message(ws)
        assert error["type"] == "error" and error["code"] == "invalid_parameter" and error["status"] == 400
        assert error["message"].startswith("timestamps: ") and "'word' or 'character'" in error["message"]
        with pytest.raises(Exception) as closed:
            next_message(ws)
    assert closed.value.rcvd.code == 1008


def test_a_cancelled_turn_sends_no_timestamps_for_audio_it_did_not_send(server):
    long = " ".join(f"This is sentence number {i} of a longer reply." for i in range(8))
    with connect(server) as ws:
        configure(ws, timestamps="word", chunking=CHUNKING, seed=5)
        send(ws, type="text", turn_id="t", text=long)
        send(ws, type="flush", turn_id="t")
        messages = [next_message(ws)]
        while not isinstance(messages[-1], tuple):  # the first audio frame
            messages.append(next_message(ws))
        send(ws, type="cancel", turn_id="t")
        while not (isinstance(messages[-1], dict) and messages[-1]["type"] == "cancelled"):
            messages.append(next_message(ws))
    assert messages[-1]["type"] == "cancelled" and not any(m.get("type") == "done" for m in messages[:-1]
                                                            if isinstance(m, dict))
    for event, sent in _timestamps_with_audio_before(messages):
        assert event["word_timestamps"]["end"][-1] <= sent + 1e-4
