"""A test client of the voice-agent WebSocket (the ``websockets`` package's sync client)."""
from __future__ import annotations

import json
import struct

from websockets.sync.client import connect as ws_connect

PATH = "/v1/audio/speech/stream"
TIMEOUT_S = 60.0


def connect(server, *, query: str = "", headers: dict | None = None, **options):
    """A connection to ``server`` (a ``LiveServer``)."""
    url = server.url.replace("http://", "ws://") + PATH + query
    return ws_connect(url, additional_headers=headers, open_timeout=30, close_timeout=10, max_size=None,
                      compression=None, **options)


def send(ws, **message) -> None:
    ws.send(json.dumps(message))


def configure(ws, **fields) -> dict:
    """Send ``config`` and return the ``ready`` event."""
    fields.setdefault("model", "chatterbox-turbo")
    send(ws, type="config", **fields)
    ready = next_message(ws)
    assert ready["type"] == "ready", ready
    return ready


def split_frame(data: bytes) -> tuple[dict, bytes]:
    """(header, audio) of a binary frame."""
    (size,) = struct.unpack(">H", data[:2])
    return json.loads(data[2:2 + size].decode()), data[2 + size:]


def next_message(ws, timeout: float = TIMEOUT_S):
    """The next message: an event (dict) or a binary frame as (header, audio)."""
    message = ws.recv(timeout=timeout)
    if isinstance(message, bytes):
        return split_frame(message)
    return json.loads(message)


class Turn:
    """What one turn received: events by type and its frames in order."""

    def __init__(self):
        self.events: list[dict] = []
        self.frames: list[tuple[dict, bytes]] = []

    @property
    def audio(self) -> bytes:
        return b"".join(audio for _, audio in self.frames)

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]


def collect(ws, turn_ids, until=("done", "error", "cancelled"), timeout: float = TIMEOUT_S) -> dict[str, Turn]:
    """Read until every turn of ``turn_ids`` got one of ``until``."""
    turns = {t: Turn() for t in turn_ids}
    open_ids = set(turn_ids)
    while open_ids:
        message = next_message(ws, timeout)
        if isinstance(message, tuple):
            turns[message[0]["turn_id"]].frames.append(message)
            continue
        turn_id = message.get("turn_id")
        assert turn_id in turns, message
        turns[turn_id].events.append(message)
        if message["type"] in until:
            open_ids.discard(turn_id)
    return turns
