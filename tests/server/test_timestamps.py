"""Timestamps over HTTP (``timestamps`` on POST /v1/audio/speech): a JSON response with the
audio and the timings, SSE events after each chunk's audio, the same timings either way, the
response's speed applied, bad values refused; on Turbo (estimate) and on an original T3 with the
alignment heads (alignment)."""
from __future__ import annotations

import base64
import json

import pytest
from openai import OpenAI

from tests.server.conftest import decode
from tests.server.live import aligned_live_server

TEXT = "Hello there, this is a test."


@pytest.fixture(scope="module")
def original(module_tmp_path_factory):
    with aligned_live_server(module_tmp_path_factory.mktemp("voices-original")) as live:
        yield live


def _events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line[len("data: "):]) for line in response.text.split("\n\n") if line.startswith("data: ")]


def _json(response) -> dict:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def _check_words(words: list[dict], duration: float) -> None:
    assert [w["word"] for w in words] == TEXT.split()
    ends = 0.0
    for word in words:
        assert ends <= word["start"] < word["end"] <= duration + 1e-4
        ends = word["end"]


def test_a_json_response_carries_the_audio_and_the_words(server):
    body = _json(server.speech(input=TEXT, response_format="pcm", seed=5, timestamps="word"))
    plain = server.speech(input=TEXT, response_format="pcm", seed=5)
    audio = base64.b64decode(body["audio_base64"])
    assert audio == plain.content and body["format"] == "pcm" and body["method"] == "estimate"
    _check_words(body["words"], decode("pcm", audio)[0].size / 24_000)


def test_character_timestamps_spell_the_input_in_elevenlabs_shape(server):
    alignment = _json(server.speech(input=TEXT, response_format="pcm", seed=5, timestamps="character"))["alignment"]
    assert "".join(alignment["characters"]) == TEXT
    starts, ends = alignment["character_start_times_seconds"], alignment["character_end_times_seconds"]
    assert len(starts) == len(ends) == len(TEXT)
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))


def test_the_openai_sdk_gets_the_json_response_through_extra_body(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="not-checked", max_retries=0)
    response = client.audio.speech.create(model="chatterbox-turbo", voice="default", input=TEXT,
                                          response_format="wav", extra_body={"timestamps": "word", "seed": 5})
    body = json.loads(response.content)
    assert base64.b64decode(body["audio_base64"])[:4] == b"RIFF" and body["format"] == "wav"
    assert [w["word"] for w in body["words"]] == TEXT.split()


def test_sse_sends_the_timestamps_after_the_audio_equal_to_the_json_ones(server):
    events = _events(server.speech(input=TEXT, response_format="pcm", seed=5, stream_format="sse",
                                   timestamps="word"))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "speech.audio.delta" and kinds[-1] == "speech.audio.done"
    timestamps = [e for e in events if e["type"] == "speech.timestamps"]
    assert [e["chunk"] for e in timestamps] == [0]
    whole = _json(server.speech(input=TEXT, response_format="pcm", seed=5, timestamps="word"))
    assert timestamps[0]["words"] == whole["words"] and timestamps[0]["method"] == whole["method"]


def test_speed_scales_the_timestamps(server):
    normal = _json(server.speech(input=TEXT, response_format="pcm", seed=5, timestamps="word"))["words"]
    fast = _json(server.speech(input=TEXT, response_format="pcm", seed=5, timestamps="word", speed=2.0))["words"]
    assert [w["end"] for w in fast] == pytest.approx([w["end"] / 2 for w in normal], abs=1e-4)


def test_pauses_keep_their_length_in_the_timestamps_at_speed(server):
    text = 'First part. <break time="1s"/> Second part.'
    words = _json(server.speech(input=text, response_format="pcm", seed=5, timestamps="word", speed=2.0))["words"]
    first_end = words[1]["end"]
    assert words[2]["start"] == pytest.approx(first_end + 1.0, abs=1e-3)


def test_a_bad_timestamps_value_is_a_400_naming_the_field(server):
    response = server.speech(input=TEXT, timestamps="sentence")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "timestamps"


def test_streamed_audio_bytes_with_timestamps_are_a_400(server):
    response = server.speech(input=TEXT, response_format="mp3", stream=True, timestamps="word")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "timestamps" and "sse" in error["message"]


def test_an_original_model_with_the_alignment_heads_times_by_alignment(original):
    response = original.speech(model="chatterbox-original", input=TEXT, response_format="pcm", seed=5,
                               timestamps="word")
    body = _json(response)
    assert body["method"] == "alignment"
    _check_words(body["words"], decode("pcm", base64.b64decode(body["audio_base64"]))[0].size / 24_000)


def test_timestamps_are_off_by_default(server):
    response = server.speech(input=TEXT, response_format="pcm", seed=5, stream_format="sse")
    assert "speech.timestamps" not in {e["type"] for e in _events(response)}
