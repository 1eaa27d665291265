"""The voices API on a live server: upload, reuse, list, delete, persistence across a restart,
and bad uploads."""
from __future__ import annotations

import io
import random
import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tests.conftest import DATA_DIR
from tests.server.live import LiveServer, server_config, tiny_loader
from tests.voices.front_ends import tiny_front_end
from tests.engine.tiny_models import tiny

CLIP = Path(DATA_DIR) / "sample-01.mp3"


def _server(voices_dir: Path, **overrides) -> LiveServer:
    config = server_config(voices_dir, **overrides)
    return LiveServer(config, tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0])))


@pytest.fixture(scope="module")
def voices_server(module_tmp_path_factory):
    with _server(module_tmp_path_factory.mktemp("voices"), max_upload_bytes=2 << 20) as live:
        yield live


def _upload(server, data: bytes, name: str | None = "me", filename: str = "clip.mp3"):
    files = {"file": (filename, data, "application/octet-stream")}
    return server.client.post("/v1/voices", files=files, data={"name": name} if name else {})


def test_an_uploaded_voice_speaks_and_is_listed(voices_server):
    created = _upload(voices_server, CLIP.read_bytes())
    assert created.status_code == 201, created.text
    voice = created.json()
    assert voice["object"] == "voice" and voice["name"] == "me" and voice["duration_s"] > 1
    listed = [v["id"] for v in voices_server.client.get("/v1/voices").json()["data"]]
    assert listed[0] == "default" and voice["id"] in listed
    assert voices_server.client.get(f"/v1/voices/{voice['id']}").json() == voice
    speech = voices_server.speech(input="Hello there.", voice=voice["id"], response_format="pcm", seed=1)
    default = voices_server.speech(input="Hello there.", response_format="pcm", seed=1)
    assert speech.status_code == 200 and speech.content != default.content


def test_the_same_clip_is_one_voice(voices_server):
    first = _upload(voices_server, CLIP.read_bytes(), name="first").json()
    again = _upload(voices_server, CLIP.read_bytes(), name="second")
    assert again.status_code == 201 and again.json()["id"] == first["id"]


def test_a_deleted_voice_is_gone(voices_server):
    data = (Path(DATA_DIR) / "sample-01-02.flac").read_bytes()
    voice_id = _upload(voices_server, data).json()["id"]
    deleted = voices_server.client.delete(f"/v1/voices/{voice_id}")
    assert deleted.json() == {"id": voice_id, "object": "voice", "deleted": True}
    assert voices_server.client.get(f"/v1/voices/{voice_id}").status_code == 404
    assert voices_server.speech(input="Hi.", voice=voice_id).status_code == 400
    assert voices_server.client.delete(f"/v1/voices/{voice_id}").status_code == 404


def test_the_default_voice_cannot_be_deleted(voices_server):
    response = voices_server.client.delete("/v1/voices/default")
    assert response.status_code == 409 and response.json()["error"]["code"] == "reserved_voice"


def test_voices_survive_a_restart(tmp_path):
    with _server(tmp_path) as live:
        voice_id = _upload(live, CLIP.read_bytes()).json()["id"]
    with _server(tmp_path) as live:
        assert voice_id in [v["id"] for v in live.client.get("/v1/voices").json()["data"]]
        assert live.speech(input="Hello.", voice=voice_id, response_format="pcm").status_code == 200


def test_servers_sharing_a_voices_url_share_voices(tmp_path):
    url = f"memory://chorus-test-{uuid.uuid4().hex}/voices"  # one object store for both servers
    with _server(tmp_path / "a", voices_url=url) as first, _server(tmp_path / "b", voices_url=url) as second:
        voice_id = _upload(first, CLIP.read_bytes()).json()["id"]
        assert voice_id in [v["id"] for v in second.client.get("/v1/voices").json()["data"]]
        speech = second.speech(input="Hello.", voice=voice_id, response_format="pcm")
        assert speech.status_code == 200, speech.text
        assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [f"{voice_id}.turbo.safetensors"]  # its cache
        assert second.client.delete(f"/v1/voices/{voice_id}").json()["deleted"] is True
        assert first.client.get(f"/v1/voices/{voice_id}").status_code == 404


def _wav(seconds: float) -> bytes:
    buffer = io.BytesIO()
    t = np.arange(int(16_000 * seconds)) / 16_000
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 220 * t), 16_000, format="WAV")
    return buffer.getvalue()


@pytest.mark.parametrize("data, status, code", [
    (b"", 400, "empty"),
    (b"this is not audio at all, just text" * 10, 400, "invalid_audio"),
    (CLIP.read_bytes()[: len(CLIP.read_bytes()) // 50], 400, "__any__"),  # truncated: too short or corrupt
    (_wav(0.2), 400, "too_short"),
    (b"\0" * (3 << 20), 413, "too_large"),  # over the 2 MiB limit
])
def test_bad_uploads_are_clear_errors_and_store_nothing(voices_server, data, status, code):
    before = voices_server.client.get("/v1/voices").json()["data"]
    response = _upload(voices_server, data)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if code != "__any__":
        assert error["code"] == code
    assert error["message"]
    assert voices_server.client.get("/v1/voices").json()["data"] == before


def test_random_bytes_are_not_audio_in_a_users_words(voices_server):
    response = _upload(voices_server, random.Random(7).randbytes(1 << 20))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_audio" and error["param"] == "file"
    assert error["message"] == ("not an audio file we can decode (tried: wav, flac, ogg, mp3, aiff, m4a/aac, webm, "
                                "...), or the data is corrupt or truncated")


LIMIT = 2 << 20  # voices_server's max_upload_bytes


def _chunked_upload(server, data: bytes):
    """An upload sent with chunked transfer encoding (no Content-Length), as a streaming client sends it."""
    boundary = "chorus-test-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body():
        yield head
        for start in range(0, len(data), 1 << 16):
            yield data[start:start + (1 << 16)]
        yield tail

    return server.client.post("/v1/voices", content=body(),
                              headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})


@pytest.mark.parametrize("size, how", [
    (LIMIT + 40, "form"),  # the body is within the limit and framing: the clip is found over it while read
    (LIMIT + 514_240, "form"),  # the body's Content-Length is over the limit and framing: refused unread
    (LIMIT + 514_240, "chunked"),  # no Content-Length: refused once the count passes the limit
], ids=["clip", "content-length", "chunked"])
def test_a_clip_over_the_upload_limit_has_one_code_and_message_however_it_is_found(voices_server, size, how):
    data = b"\0" * size
    response = _upload(voices_server, data) if how == "form" else _chunked_upload(voices_server, data)
    assert response.status_code == 413, response.text
    assert response.json()["error"] == {
        "code": "too_large", "param": "file", "type": "invalid_request_error",
        "message": f"a clip is larger than this server's upload limit, {LIMIT} bytes (max_upload_bytes)"}


def test_an_upload_without_a_file_field(voices_server):
    response = voices_server.client.post("/v1/voices", data={"name": "x"}, files={"other": ("a", b"123")})
    assert response.status_code == 400 and response.json()["error"]["code"] == "missing_file"


def test_an_upload_that_is_not_multipart(voices_server):
    response = voices_server.client.post("/v1/voices", json={"file": "abc"})
    assert response.status_code == 415


def test_a_malformed_voice_id_is_not_found(voices_server):
    assert voices_server.client.get("/v1/voices/..%2F..%2Fetc").status_code == 404
    assert voices_server.client.get("/v1/voices/UPPER").status_code == 404


def test_speaking_with_a_voice_name_says_to_use_its_id(voices_server):
    """The README's flow: upload with a name, then speak with it; the name is not the id."""
    samples, rate = soundfile.read(Path(DATA_DIR) / "sample-01-02.flac")
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.9 * samples, rate, format="WAV")  # a clip no other test uploads
    voice_id = _upload(voices_server, buffer.getvalue(), name="readme-voice", filename="clip.wav").json()["id"]
    response = voices_server.speech(input="Hello.", voice="readme-voice")
    assert response.status_code == 400 and response.json()["error"]["code"] == "voice_not_found"
    message = response.json()["error"]["message"]
    assert "name" in message and voice_id in message
    assert voices_server.speech(input="Hello.", voice=voice_id, response_format="pcm").status_code == 200
