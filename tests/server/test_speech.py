"""POST /v1/audio/speech through the official openai client and httpx: every format, streamed or
not, SSE events, speed, seeds and response headers."""
from __future__ import annotations

import base64
import io
import json
import wave

import numpy as np
import pytest
import soundfile
from openai import OpenAI

from tests.server.conftest import decode
from tests.server.live import TOKENS

FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
TEXT = "Hello there, this is a test."
# 12 tokens (+ turbo's 3 trailing silence tokens) -> 30 mel frames -> 0.6 s at 24 kHz, unless EOS came first
SAMPLES = (TOKENS + 3) * 2 * 480
CODEC_SLACK_S = 0.1  # encoder priming and frame padding: AAC adds up to 2 x 1024 samples (docs/audio-formats.md)


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="not-checked", max_retries=0)


@pytest.fixture(scope="module")
def reference_samples(server):
    """The raw PCM of TEXT with seed 5: what every format must carry."""
    response = server.speech(input=TEXT, response_format="pcm", seed=5)
    assert response.status_code == 200, response.text
    samples, _ = decode("pcm", response.content)
    assert 0 < samples.size <= SAMPLES
    return samples


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_to_the_requested_audio(client, reference_samples, fmt):
    response = client.audio.speech.create(model="chatterbox-turbo", voice="default", input=TEXT,
                                          response_format=fmt, extra_body={"seed": 5})
    samples, rate = decode(fmt, response.content)
    want = reference_samples.size / 24_000
    assert abs(samples.size / rate - want) <= CODEC_SLACK_S, (fmt, samples.size / rate, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_streams_through_the_sdk(client, reference_samples, fmt):
    chunks = []
    with client.audio.speech.with_streaming_response.create(
            model="chatterbox-turbo", voice="default", input=TEXT, response_format=fmt,
            extra_body={"seed": 5}) as response:
        assert response.headers["content-type"].startswith("audio/")
        chunks = list(response.iter_bytes())
    samples, rate = decode(fmt, b"".join(chunks))
    assert abs(samples.size / rate - reference_samples.size / 24_000) <= CODEC_SLACK_S


def test_the_same_seed_gives_the_same_audio(server, reference_samples):
    again, _ = decode("pcm", server.speech(input=TEXT, response_format="pcm", seed=5).content)
    np.testing.assert_array_equal(again, reference_samples)


def test_the_seed_used_is_returned_so_a_result_can_be_reproduced(server):
    first = server.speech(input=TEXT, response_format="pcm")
    seed = int(first.headers["x-chorus-seed"])
    again = server.speech(input=TEXT, response_format="pcm", seed=seed)
    assert again.content == first.content


def test_sse_sends_audio_deltas_then_done_with_usage(server, reference_samples):
    response = server.speech(input=TEXT, response_format="pcm", stream_format="sse", seed=5)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) >= 2
    assert events[-1]["type"] == "speech.audio.done"
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    np.testing.assert_array_equal(decode("pcm", audio)[0], reference_samples)


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_speed_changes_the_duration(server, reference_samples, speed):
    response = server.speech(input=TEXT, response_format="pcm", seed=5, speed=speed)
    samples, _ = decode("pcm", response.content)
    assert samples.size == pytest.approx(reference_samples.size / speed, rel=0.1)


def test_responses_carry_the_request_id_and_degradation_headers(server):
    response = server.client.post("/v1/audio/speech", headers={"X-Request-Id": "my-id-42"},
                                  json={"model": "chatterbox-turbo", "input": TEXT, "response_format": "pcm"})
    assert response.headers["x-request-id"] == "my-id-42"
    assert response.headers["x-chorus-degradation"] == "0"
    assert response.headers["x-chorus-degraded"] == "none"


def test_a_long_text_is_spoken_in_chunks_in_one_response(server):
    text = " ".join(f"Sentence number {w} is right here." for w in ("one", "two", "three", "four"))
    samples, _ = decode("pcm", server.speech(input=text, response_format="pcm", seed=1).content)
    assert samples.size > SAMPLES  # more than one chunk's worth


def test_models_lists_the_served_model(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["chatterbox-turbo", "turbo"]


def test_a_wav_response_has_complete_headers(server):
    """What the README's `curl ... -o hello.wav` gets: a file whose header gives its length."""
    response = server.speech(input="Hello there.", response_format="wav", seed=3)
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as wav:
        frames = wav.getnframes()
    assert frames == (len(response.content) - 44) // 2 > 0


def test_a_flac_response_has_complete_headers(server):
    response = server.speech(input="Hello there.", response_format="flac", seed=3)
    samples, rate = soundfile.read(io.BytesIO(response.content), dtype="int16")
    wav = server.speech(input="Hello there.", response_format="wav", seed=3).content
    assert rate == 24_000 and samples.tobytes() == wav[44:]


def test_a_streamed_wav_keeps_the_open_ended_header(server):
    response = server.speech(input="Hello there.", response_format="wav", seed=3, stream=True)
    assert response.content[4:8] == b"\xff\xff\xff\xff" and response.content[40:44] == b"\xff\xff\xff\xff"
    whole = server.speech(input="Hello there.", response_format="wav", seed=3, stream=False).content
    assert response.content[44:] == whole[44:]


def _longest_zero_run(samples: np.ndarray) -> int:
    edges = np.diff(np.concatenate([[0], (samples == 0).astype(np.int8), [0]]))
    return int((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max(initial=0))


def test_a_break_is_exact_silence_in_the_response_at_any_speed(client):
    response = client.audio.speech.create(model="chatterbox-turbo", voice="default", response_format="pcm",
                                          input='Hello there. <break time="1s"/> And again.',
                                          speed=0.5, extra_body={"seed": 5})
    samples, _ = decode("pcm", response.content)
    assert 24_000 <= _longest_zero_run(samples) <= 24_000 + 0.1 * 24_000  # the chunks' own edges may be silent


def test_ssml_is_spoken_end_to_end_with_its_prosody_rate_as_the_speed(client):
    def seconds(ssml: str) -> float:
        response = client.audio.speech.create(model="chatterbox-turbo", voice="default", response_format="pcm",
                                              input=ssml, extra_body={"seed": 5, "input_format": "ssml"})
        return decode("pcm", response.content)[0].size / 24_000

    plain = seconds('<speak><p>Hello there.</p><break time="500ms"/><p>And again.</p></speak>')
    slow = seconds('<speak><prosody rate="50%"><p>Hello there.</p><break time="500ms"/><p>And again.</p>'
                   '</prosody></speak>')
    assert slow - 0.5 == pytest.approx(2 * (plain - 0.5), rel=0.1)  # the speech slowed, the pause kept


def test_an_ssml_element_outside_the_subset_is_a_400_naming_it_and_its_place(server):
    response = server.speech(input='<speak>Hi <emphasis>there</emphasis>.</speak>', input_format="ssml")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("<emphasis> is not supported") and "line 1, column 11" in error["message"]
    assert (error["param"], error["code"]) == ("input", "invalid_input")


def test_a_malformed_break_tag_is_a_400_naming_the_problem(server):
    response = server.speech(input='Hello <break time="forever"/> there.')
    assert response.status_code == 400 and "break time 'forever'" in response.json()["error"]["message"]


def test_a_prosody_rate_that_takes_the_speed_out_of_range_is_a_400_on_speed(server):
    response = server.speech(input='<speak><prosody rate="x-fast">Hi there.</prosody></speak>', input_format="ssml",
                             speed=4.0)
    assert response.status_code == 400 and response.json()["error"]["param"] == "speed"
    assert "speed must be between 0.25 and 4.0, got 8.0" in response.json()["error"]["message"]
