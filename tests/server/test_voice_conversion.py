"""POST /v1/audio/voice-conversion on a live server over tiny models that can convert: the audio
of a source clip in the target voice (built-in, a stored voice, or a clip), admission, and every
refusal of bad input with its status and code."""
from __future__ import annotations

import concurrent.futures
import io

import httpx
import numpy as np
import pytest
import soundfile

from chorus.conversion import ConversionRequest
from chorus.models.s3gen.s3gen import SAMPLE_RATE
from tests.conversion.tiny_conversion import speech, tiny_conversion_models
from tests.engine.tiny_models import tiny
from tests.server.live import EnginePause, LiveServer, metric, server_config, tiny_loader, until
from tests.voices.front_ends import tiny_front_end

pytestmark = pytest.mark.timeout(180)
PATH = "/v1/audio/voice-conversion"
SAMPLES_PER_TOKEN = SAMPLE_RATE // 25  # S3Gen speaks 960 samples per speech token


def _wav(seconds: float) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, speech(seconds), 16000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


SOURCE = _wav(2.0)
CLIP = _wav(5.5)  # a target clip: a Turbo voice needs more than 5 s


def _loader(config):
    return tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0]), models_of=tiny_conversion_models)


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), max_source_s=5.0)
    with LiveServer(config, _loader(config)) as live:
        yield live


def _convert(server, *, source: bytes | None = SOURCE, clip: bytes | None = None, **fields) -> httpx.Response:
    fields = {"model": "chatterbox-turbo", "response_format": "pcm", "flow_steps": "2", **fields}
    files = {}
    if source is not None:
        files["file"] = ("source.wav", source, "audio/wav")
    if clip is not None:
        files["voice_file"] = ("target.wav", clip, "audio/wav")
    return server.client.post(PATH, data=fields, files=files or None)


def test_a_source_comes_back_in_the_built_in_voice_as_the_pipeline_speaks_it(server):
    response = _convert(server, seed="7", stream="false")  # one pass, as Pipeline.convert's default
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("audio/pcm") and response.headers["x-chorus-seed"] == "7"
    audio = np.frombuffer(response.content, dtype="<i2")
    direct = server.pipeline.convert(ConversionRequest(SOURCE, seed=7, flow_steps=2)).result()
    assert len(audio) == direct.chunks[0].speech_tokens * SAMPLES_PER_TOKEN == len(direct.wav)
    assert np.abs(audio / 32768.0 - direct.wav).max() < 2e-3  # pcm16 of the same waveform


def test_the_target_may_be_a_stored_voice_or_a_clip_but_not_both(server):
    upload = server.client.post("/v1/voices", files={"file": ("ada.wav", CLIP, "audio/wav")})
    assert upload.status_code == 201, upload.text
    by_id = _convert(server, voice=upload.json()["id"], seed="3")
    by_clip = _convert(server, clip=CLIP, seed="3")
    default = _convert(server, seed="3")
    assert by_id.status_code == by_clip.status_code == default.status_code == 200
    # the source sets the length (the target's prompt may shift it by a mel frame, as in the reference)
    assert len(by_id.content) == len(by_clip.content) and abs(len(by_id.content) - len(default.content)) <= 2 * 480
    assert by_id.content != default.content[:len(by_id.content)]  # another voice
    both = _convert(server, voice=upload.json()["id"], clip=CLIP)
    assert both.status_code == 400 and both.json()["error"]["param"] == "voice"


def test_a_streamed_conversion_is_sent_in_pieces(server):
    with server.client.stream("POST", PATH, data={"model": "chatterbox-turbo", "response_format": "pcm",
                                                  "flow_steps": "2", "stream": "true", "seed": "7"},
                              files={"file": ("source.wav", SOURCE, "audio/wav")}) as response:
        assert response.status_code == 200
        pieces = [piece for piece in response.iter_raw() if piece]
    whole = _convert(server, seed="7")
    assert sum(map(len, pieces)) == len(whole.content)


@pytest.mark.parametrize("kwargs, status, code, param", [
    (dict(source=_wav(5.7)), 413, "source_too_long", "file"),  # the server's max_source_s is 5
    (dict(source=b"not audio at all"), 400, "invalid_source", "file"),
    (dict(source=None, clip=CLIP), 400, "missing_file", "file"),
    (dict(voice="nobody"), 400, "voice_not_found", "voice"),
    (dict(clip=b"not audio either"), 400, "invalid_voice_clip", "voice_file"),
    (dict(model="whisper-1"), 400, "model_not_found", "model"),
    (dict(flow_steps="0"), 400, "invalid_parameter", "flow_steps"),
    (dict(speed="2"), 400, "invalid_parameter", "speed"),  # not a field of this endpoint
])
def test_bad_input_is_refused_with_its_status_code_and_param(server, kwargs, status, code, param):
    response = _convert(server, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    server.wait_idle()  # nothing was left running


def test_a_json_body_is_refused_as_the_wrong_media_type(server):
    response = server.client.post(PATH, json={"model": "chatterbox-turbo"})
    assert response.status_code == 415


def test_a_full_server_refuses_a_conversion_before_any_model_work(tmp_path):
    config = server_config(tmp_path, max_queue=3, retry_after_s=2)
    body = {"model": "chatterbox-turbo", "input": "Hello there.", "response_format": "pcm"}
    with LiveServer(config, _loader(config)) as server, concurrent.futures.ThreadPoolExecutor(2) as pool:
        with EnginePause(server):  # T3 holds two speech requests: normal priority's share is taken
            held = [pool.submit(httpx.post, f"{server.url}/v1/audio/speech", json=body, timeout=60)
                    for _ in range(2)]
            until(lambda: server.service.admission.in_flight == 2, what="the speech requests' admission")
            refused = _convert(server)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
            assert refused.json()["error"]["code"] == "queue_full"
            urgent = _convert(server, priority="high")  # the vocoder is free: high priority converts now
            assert urgent.status_code == 200, urgent.text
        assert all(f.result().status_code == 200 for f in held)
        metrics = server.client.get("/metrics").text
        assert metric(metrics, "chorus_admission_refusals_total", 'reason="queue_full"') == 1
