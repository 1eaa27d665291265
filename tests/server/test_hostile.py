"""Hostile input at the server's edges: decompression bombs, oversized headers, slow bodies,
API keys that are not ASCII, and request ids or paths built to forge log lines. Each test talks
to a live server over loopback (raw sockets where a client library would refuse the input)."""
from __future__ import annotations

import io
import logging
import socket

import numpy as np
import pytest
import soundfile

from chorus.server.logs import TextFormatter
from tests.engine.tiny_models import tiny
from tests.server.live import LiveServer, access_record, server_config, tiny_loader
from tests.voices.front_ends import tiny_front_end

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def guarded(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), api_keys=("first-key-0001", "second-key-002"),
                           max_header_bytes=4096, body_timeout_s=0.5)
    with LiveServer(config, tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0])),
                    api_key="second-key-002") as live:
        yield live


def _raw(server: LiveServer, request: bytes, *, then: bytes | None = None) -> bytes:
    """Send ``request`` on a fresh connection and read the answer until the server closes it or
    sends a complete response head and body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
            head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(body) >= length:
                break
        return b"".join(chunks)


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


# ---- decompression bombs --------------------------------------------------------------------------

def bomb(minutes: int, *, stated: bool = True, rate: int = 8000) -> bytes:
    """A FLAC of ``minutes`` of silence (about 1.4 KB a minute); ``stated=False`` blanks the
    length in its header, so only decoding can tell how long it is."""
    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", samplerate=rate, channels=1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(minutes):
            f.write(np.zeros(rate * 60, dtype=np.float32))
    data = bytearray(buffer.getvalue())
    if not stated:  # STREAMINFO's 36-bit total-samples field ends at byte 26
        head = int.from_bytes(data[18:26], "big")
        data[18:26] = (head & ~((1 << 36) - 1)).to_bytes(8, "big")
    return bytes(data)


@pytest.mark.parametrize("stated", [True, False], ids=["length-in-header", "length-hidden"])
def test_a_decompression_bomb_upload_is_refused_by_its_decoded_length(guarded, stated):
    data = bomb(70, stated=stated)  # 70 minutes of audio in about 100 KB
    assert len(data) < 200_000
    response = guarded.client.post("/v1/voices", files={"file": ("bomb.flac", data, "audio/flac")})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "too_long" and "too long" in error["message"]
    assert guarded.client.get("/v1/voices").json()["data"][1:] == []


# ---- header and body limits ---------------------------------------------------------------------

def test_headers_over_max_header_bytes_are_refused_and_the_server_goes_on(guarded):
    def get(header_bytes: int) -> int:
        request = (f"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: {'a' * header_bytes}\r\n"
                   f"Connection: close\r\n\r\n").encode()
        return _status(_raw(guarded, request))

    assert get(2000) == 200
    assert get(8000) == 431  # over max_header_bytes=4096
    assert get(10) == 200


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/v1/voices"])
def test_a_body_that_trickles_in_times_out_with_408(guarded, path):
    kind = "application/json" if path == "/v1/audio/speech" else "multipart/form-data; boundary=b"
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer first-key-0001\r\n"
               f"Content-Type: {kind}\r\nContent-Length: 1000\r\n\r\n--b\r\n").encode()
    response = _raw(guarded, request)  # then nothing more: the server must give up after body_timeout_s
    assert _status(response) == 408 and b'"body_timeout"' in response
    assert guarded.client.get("/health").status_code == 200


# ---- API keys -----------------------------------------------------------------------------------

@pytest.mark.parametrize("header", [b"Bearer wrong-key-0001", b"Bearer first-key-0001x", b"Basic first-key-0001",
                                   "Bearer cl\u00e9-\u00e0-accents".encode("latin-1"), b"Bearer \xff\xfe\x80x"],
                         ids=["wrong", "longer", "scheme", "latin-1", "high-bytes"])
def test_a_bad_api_key_is_a_401_never_a_500(guarded, header):
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + header + b"\r\nConnection: close\r\n\r\n"
    response = _raw(guarded, request)
    assert _status(response) == 401 and b'"invalid_api_key"' in response


def test_every_configured_key_works_and_probes_and_metrics_need_none(guarded):
    for key in ("first-key-0001", "second-key-002"):
        assert guarded.client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    bare = {"Authorization": ""}
    for path in ("/health", "/ready", "/metrics"):
        assert guarded.client.get(path, headers=bare).status_code == 200
    for path in ("/v1/models", "/v1/voices"):
        assert guarded.client.get(path, headers=bare).status_code == 401


# ---- request ids and log lines ------------------------------------------------------------------

def test_request_ids_and_paths_cannot_forge_log_lines(guarded, caplog):
    evil_id = b'abc" level=error msg="forged'  # valid header text, not a token: HTTP itself refuses controls
    request = (b"GET /v1/voices/a%0Alevel%3Derror%20forged%E2%80%AE HTTP/1.1\r\nHost: x\r\n"
               b"Authorization: Bearer first-key-0001\r\nX-Request-Id: " + evil_id + b"\r\nConnection: close\r\n\r\n")
    with caplog.at_level(logging.INFO, logger="chorus.server"):
        response = _raw(guarded, request)
    assert _status(response) == 404
    echoed = next(line for line in response.split(b"\r\n") if line.lower().startswith(b"x-request-id:"))
    assert echoed.split(b":", 1)[1].strip().startswith(b"req-")  # a fresh id: the client's was not a token
    access = access_record(caplog, "GET /v1/voices/")
    line = TextFormatter().format(access)
    assert "\n" not in line and "\r" not in line and "\u202e" not in line and "\\u000a" in line
    assert access.request_id.startswith("req-")


def test_a_long_request_id_is_replaced_and_a_long_path_is_cut_in_the_log(guarded, caplog):
    with caplog.at_level(logging.INFO, logger="chorus.server"):
        response = guarded.client.get("/v1/voices/" + "a" * 3000, headers={"X-Request-Id": "r" * 65})
    assert response.status_code == 404 and response.headers["x-request-id"].startswith("req-")
    access = access_record(caplog, "GET /v1/voices/")
    assert len(access.getMessage()) < 400 and "more]" in access.getMessage()
