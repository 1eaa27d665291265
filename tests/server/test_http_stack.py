"""The server's HTTP stack as ``chorus serve`` sets it up: either parser keeps the bound on a
request's head (431), and the interpreter's GIL switch interval is the configured one once the
server has started. Live servers over loopback, raw sockets where a client library would refuse
the input."""
from __future__ import annotations

import json
import socket
import sys

import pytest

from chorus.server.main import uvicorn_options
from tests.server import test_hostile
from tests.server.live import LiveServer, server_config, tiny_loader

pytestmark = pytest.mark.timeout(120)
LIMIT = 4096


@pytest.fixture(scope="module", params=["httptools", "h11"])
def parsed(request, module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), max_header_bytes=LIMIT,
                           http_parser=request.param)
    with LiveServer(config, tiny_loader(config)) as live:
        yield live


def test_the_configured_parser_runs(parsed):
    http = uvicorn_options(parsed.config)["http"]
    assert (http == "h11") == (parsed.config.http_parser == "h11")
    assert parsed.client.get("/health").status_code == 200


def test_a_complete_head_over_the_bound_is_refused_with_431(parsed):
    test_hostile.test_headers_over_max_header_bytes_are_refused_and_the_server_goes_on(parsed)


def test_a_head_that_grows_past_the_bound_unfinished_is_refused_and_closed(parsed):
    # no blank line ends it: the parser must stop buffering it instead of waiting for the end
    head = f"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: {'a' * (2 * LIMIT)}\r\n".encode()
    with socket.create_connection(("127.0.0.1", parsed.port), timeout=30) as sock:
        sock.sendall(head)
        chunks = []
        while data := sock.recv(65536):  # the server closes the connection
            chunks.append(data)
    answer = b"".join(chunks)
    if parsed.config.http_parser == "httptools":
        status, _, body = answer.partition(b"\r\n\r\n")
        assert test_hostile._status(answer) == 431 and b"connection: close" in status.lower()
        assert json.loads(body)["error"]["code"] == "headers_too_large"
    else:  # h11's own bound answers 400
        assert test_hostile._status(answer) == 400
    assert parsed.client.get("/health").status_code == 200


def test_requests_on_a_kept_alive_connection_each_get_the_whole_bound(parsed):
    # the bound is per request head, not per connection
    padding = "a" * (LIMIT // 2)
    with socket.create_connection(("127.0.0.1", parsed.port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for _ in range(4):
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: {padding}\r\n\r\n".encode())
            assert reader.readline().split()[1] == b"200"
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)


def test_the_gil_switch_interval_is_set_at_start_up(tmp_path):
    before = sys.getswitchinterval()
    config = server_config(tmp_path, switch_interval_ms=0.5)
    try:
        with LiveServer(config, tiny_loader(config)):
            assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
