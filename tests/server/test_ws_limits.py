"""The voice-agent WebSocket's limits, authentication, admission and draining, on live servers
configured with small limits."""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import time

import pytest
from websockets.exceptions import InvalidStatus

from chorus.server.errors import APIError
from chorus.server.ws_agent import error_event
from tests.server.live import EnginePause, LiveServer, metric, server_config, tiny_loader, until
from tests.server.ws_client import Turn, collect, configure, connect, next_message, send

pytestmark = pytest.mark.timeout(120)

KEY = "secret-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), canary_interval_s=3600.0, api_keys=(KEY,),
                           ws_max_message_bytes=2048, ws_text_buffer_chars=300, ws_max_turns=2,
                           ws_max_connections=3, max_queue=1)
    with LiveServer(config, tiny_loader(config), api_key=KEY) as live:
        yield live


def _closed_with(ws, code: int) -> None:
    with pytest.raises(Exception):
        ws.recv(timeout=10)
    assert ws.close_code == code


def test_a_missing_or_wrong_key_is_refused_with_401_before_accept(server):
    for headers in (None, {"Authorization": "Bearer wrong-key-0"}):
        with pytest.raises(InvalidStatus) as refused:
            connect(server, headers=headers)
        assert refused.value.response.status_code == 401
        assert b"invalid_api_key" in refused.value.response.body


@pytest.mark.parametrize("how", ["header", "query"])
def test_the_key_is_taken_from_the_header_or_the_query(server, how):
    options = {"headers": AUTH} if how == "header" else {"query": f"?api_key={KEY}"}
    with connect(server, **options) as ws:
        assert configure(ws)["type"] == "ready"


def test_a_key_in_the_query_is_not_logged(server, caplog):
    with caplog.at_level(logging.INFO, logger="uvicorn.error"), connect(server, query=f"?api_key={KEY}") as ws:
        configure(ws)
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.error"]
    assert any("api_key=***" in line for line in lines), lines  # the handshake line is there, without the key
    assert not any(KEY in line for line in lines)


def test_a_message_over_the_limit_is_answered_then_closed_with_1009(server):
    with connect(server, headers=AUTH) as ws:
        configure(ws)
        send(ws, type="text", turn_id="t", text="a" * 3000)
        error = next_message(ws)
        assert error["code"] == "message_too_big" and error["turn_id"] is None and error["status"] == 413
        _closed_with(ws, 1009)


def test_text_beyond_the_buffer_cap_ends_the_turn_with_413(server):
    with connect(server, headers=AUTH) as ws:
        configure(ws, chunking={"min_chars": 1000, "max_chars": 1000, "max_wait_ms": 60_000})  # nothing is cut
        send(ws, type="text", turn_id="t", text="word " * 40)  # 200 characters waiting
        send(ws, type="text", turn_id="t", text="more " * 21)  # 105 more: past the cap of 300
        error = next_message(ws)
        assert error["code"] == "text_buffer_full" and error["turn_id"] == "t" and error["status"] == 413
        send(ws, type="text", turn_id="t", text="again")
        assert next_message(ws)["code"] == "turn_closed"  # the error ended the turn


def test_more_open_turns_than_the_limit_are_refused(server):
    with connect(server, headers=AUTH) as ws:
        configure(ws)
        send(ws, type="text", turn_id="a", text="one")  # single words: nothing is cut, nothing submitted
        send(ws, type="text", turn_id="b", text="two")
        send(ws, type="text", turn_id="c", text="three")
        error = next_message(ws)
        assert error["code"] == "too_many_turns" and error["turn_id"] == "c" and error["status"] == 429
        assert error["retry_after_s"] == server.config.retry_after_s  # as every 429 and 503 has
        send(ws, type="cancel", turn_id="a")
        assert next_message(ws) == {"type": "cancelled", "turn_id": "a"}
        send(ws, type="text", turn_id="c", text="three")  # room again
        send(ws, type="cancel", turn_id="c")
        assert next_message(ws) == {"type": "cancelled", "turn_id": "c"}


@pytest.mark.parametrize("status", [429, 503])
def test_every_429_and_503_event_carries_retry_after_s(status):
    """error_event builds every error event of the WebSocket (a turn's, a connection's, a refused
    handshake's): a 429 or 503 carries its Retry-After, or the server's least one."""
    least = 3
    bare = error_event(APIError(status, "refused", code="any"), "t", least)
    given = error_event(APIError(status, "refused", code="any", headers={"Retry-After": "7"}), "t", least)
    assert bare["retry_after_s"] == least and given["retry_after_s"] == 7
    assert error_event(APIError(400, "bad", code="any"), "t", least)["retry_after_s"] is None


def test_connections_beyond_the_limit_are_refused_with_503(server):
    with contextlib.ExitStack() as stack:
        for _ in range(3):
            configure(stack.enter_context(connect(server, headers=AUTH)))  # each is open on the server now
        with pytest.raises(InvalidStatus) as refused:
            connect(server, headers=AUTH)
        assert refused.value.response.status_code == 503
        assert b"too_many_connections" in refused.value.response.body


def test_an_admission_refusal_is_a_429_error_for_that_turn_with_retry_after(server):
    with connect(server, headers=AUTH) as ws, EnginePause(server):
        configure(ws)
        send(ws, type="text", turn_id="held", text="Hello there, the only place is mine.")
        send(ws, type="flush", turn_id="held")
        assert next_message(ws)["type"] == "piece"  # submitted: it holds the one place (max_queue=1)
        send(ws, type="text", turn_id="refused", text="Hello there, is there room for me?")
        send(ws, type="flush", turn_id="refused")
        error = next_message(ws)
        assert error["type"] == "error" and error["turn_id"] == "refused", error
        assert error["status"] == 429 and error["code"] == "queue_full" and error["retry_after_s"] >= 1
    # the pause is over: the held turn was not disturbed
    with connect(server, headers=AUTH) as ws:
        configure(ws)
    server.wait_idle()


def test_a_turns_next_piece_is_admitted_as_its_continuation_while_new_turns_are_refused(tmp_path):
    """A turn is one admitted stream: its second piece is never refused for load, so its speech is
    not cut mid-way (docs/server.md, "Admission")."""
    config = server_config(tmp_path, max_queue=1, max_new_tokens=300, canary_interval_s=3600.0)
    with LiveServer(config, tiny_loader(config)) as server, connect(server) as ws:
        configure(ws, seed=1)
        turn = Turn()

        def read_until(done) -> dict:
            while True:
                message = next_message(ws)
                if isinstance(message, tuple):
                    turn.frames.append(message)
                elif done(message):
                    return message
                else:
                    assert message["turn_id"] == "t" and message["type"] == "piece", message
                    turn.events.append(message)

        # the first piece's T3 runs 30 tokens (past the 20 of its first audio), then is held: it
        # keeps the one place of the queue (max_queue=1) while the second piece starts
        with EnginePause(server, after_tokens=30):
            send(ws, type="text", turn_id="t", text="Hello there, this is a test. It has two sentences.")
            send(ws, type="flush", turn_id="t")
            second = read_until(lambda m: m["type"] == "piece" and m["piece"] == 1)
            assert second["turn_id"] == "t" and server.service.admission.in_flight == 2
            send(ws, type="text", turn_id="new", text="Hello there, is there room for me?")
            send(ws, type="flush", turn_id="new")
            refused = read_until(lambda m: m.get("turn_id") == "new")
            assert refused["type"] == "error" and refused["code"] == "queue_full", refused
        rest = collect(ws, ["t"])["t"]
        assert rest.of("done") and not rest.of("error"), rest.events
        assert turn.frames or rest.frames
        server.wait_idle()


def test_an_idle_connection_is_closed_with_an_error_first(tmp_path):
    config = server_config(tmp_path, ws_idle_timeout_s=0.5)
    with LiveServer(config, tiny_loader(config)) as server, connect(server) as ws:
        # read before the config is sent, so before the server took its last message's time
        # (same host, same monotonic clock): the close must have waited the whole timeout since
        sent = time.monotonic()
        configure(ws)
        error = next_message(ws)
        assert error["code"] == "idle_timeout" and error["turn_id"] is None
        assert time.monotonic() - sent >= 0.5
        _closed_with(ws, 1000)


def test_draining_lets_open_turns_finish_then_closes_with_1001(tmp_path):
    config = server_config(tmp_path, shutdown_grace_s=20.0)
    with LiveServer(config, tiny_loader(config)) as server, connect(server) as ws:
        configure(ws)
        with EnginePause(server):
            send(ws, type="text", turn_id="open", text="Hello there, I am still speaking.")
            send(ws, type="flush", turn_id="open")
            assert next_message(ws)["type"] == "piece"
            server.begin_shutdown()
            deadline = time.monotonic() + 20
            while server.service.state != "draining":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            send(ws, type="text", turn_id="new", text="A new turn.")
            refused = next_message(ws)
            assert refused["code"] == "shutting_down" and refused["turn_id"] == "new" and refused["status"] == 503
            assert refused["retry_after_s"] == 5
        turn = collect(ws, ["open"])["open"]  # released: the open turn finishes
        assert turn.of("done") and turn.frames
        error = next_message(ws)
        assert error["code"] == "shutting_down" and error["turn_id"] is None and error["retry_after_s"] == 5
        _closed_with(ws, 1001)


class _RawSocket:
    """A WebSocket client on a plain socket with a small receive window, so that a test decides
    exactly when it reads (a library client reads ahead on its own)."""

    def __init__(self, port: int):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                          .encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(1024)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, **message) -> None:
        payload, mask = json.dumps(message).encode(), os.urandom(4)
        assert len(payload) < 126
        self.sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask +
                          bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def frame(self) -> tuple[int, bytes] | None:
        """The next frame (opcode, payload); None once the connection has ended."""
        try:
            while True:
                if len(self.buffer) >= 2:
                    size, start = self.buffer[1] & 0x7F, 2
                    if size >= 126:
                        width = 2 if size == 126 else 8
                        size, start = int.from_bytes(self.buffer[2:2 + width], "big"), 2 + width
                    if len(self.buffer) >= start + size:
                        frame = (self.buffer[0] & 0x0F, self.buffer[start:start + size])
                        self.buffer = self.buffer[start + size:]
                        return frame
                data = self.sock.recv(1 << 16)
                if not data:
                    return None
                self.buffer += data
        except ConnectionResetError:
            return None


def test_a_client_that_stops_reading_is_dropped_without_an_event_and_its_turn_cancelled(tmp_path):
    config = server_config(tmp_path, max_new_tokens=900, write_stall_s=0.5, canary_interval_s=3600.0)
    with LiveServer(config, tiny_loader(config), send_buffer_bytes=4096) as server:
        client = _RawSocket(server.port)
        try:
            client.send(type="config", model="chatterbox-turbo")
            opcode, ready = client.frame()
            assert opcode == 1 and json.loads(ready)["type"] == "ready"
            client.send(type="text", turn_id="t", text="Hello there, this is a long reply.")
            client.send(type="flush", turn_id="t")  # then read nothing: the server's sends soon wait
            until(lambda: metric(server.client.get("/metrics").text, "chorus_ws_turns_total",
                                 'outcome="cancelled"') == 1, timeout=60, what="the slow reader's turn to be cancelled")
            until(lambda: metric(server.client.get("/metrics").text, "chorus_ws_connections_open") == 0,
                  what="the connection to be dropped")
            frames = []
            while (frame := client.frame()) is not None and frame[0] != 8:
                frames.append(frame)
            events = [json.loads(payload)["type"] for opcode, payload in frames if opcode == 1]
            assert "error" not in events and "done" not in events, events
            if frame is not None:  # a close frame that got past the unread audio says 1008
                assert int.from_bytes(frame[1][:2], "big") == 1008
        finally:
            client.sock.close()
        server.wait_idle(timeout=10)
