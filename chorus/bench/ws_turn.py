"""A voice-agent connection as the bench's client sees it: each :class:`Turn` (its stamps, frames,
playback and outcome) and the :class:`ConnectionLog` that routes the server's audio frames and
events to them (the WebSocket protocol of docs/voice-agents.md; frames parsed by
chorus/integrations/ws_client.py)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from chorus.bench.online_bench import Playback
from chorus.integrations.ws_client import ProtocolError, parse_audio_frame

SAMPLE_BYTES = {"pcm": 2, "pcm_24000": 2, "pcm_16000": 2, "pcm_8000": 2, "mulaw_8000": 1}  # measured formats
# Turn outcomes. done / cancelled / error: the server's event ended it; lost: the connection
# closed or --timeout-s passed first; not_run: its connection ended before it could start.
OUTCOMES = ("done", "cancelled", "error", "lost", "not_run")


def _audio_seconds(nbytes: int, sample_bytes: int, rate: int) -> float:
    return nbytes // sample_bytes / rate


@dataclass
class Turn:
    """One turn as the client saw it (``time.perf_counter`` stamps)."""

    turn_id: str
    index: int = 0  # the turn's place on its connection (0: the connection's first)
    cancel_planned: bool = False
    sample_bytes: int | None = None  # None: a compressed format, measured in bytes only
    rate: int = 24_000
    first_delta: float | None = None  # stamped just before sending it
    flushed: float | None = None
    cancel_sent: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    ended_at: float | None = None
    outcome: str | None = None
    code: str | None = None
    message: str | None = None
    done: dict | None = None  # the server's done event
    frames: int = 0
    bytes: int = 0
    next_seq: int = 0
    seq_errors: int = 0
    frames_after_cancel_sent: int = 0
    frames_after_end: int = 0
    pieces: int = 0
    send_lag_s: float = 0.0  # latest a delta went out after it was due (a saturated client shows here)
    stalls: int = 0
    playback: Playback = field(default_factory=Playback)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set at the first audio and at the end
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def audio_s(self) -> float | None:
        return None if self.sample_bytes is None else _audio_seconds(self.bytes, self.sample_bytes, self.rate)

    def on_audio(self, now: float, seq: int, nbytes: int) -> None:
        if self.outcome is not None:  # after done or cancelled: the protocol says none follows
            self.frames_after_end += 1
            return
        if seq != self.next_seq:
            self.seq_errors += 1
        self.next_seq = seq + 1
        self.frames += 1
        if self.cancel_sent is not None:
            self.frames_after_cancel_sent += 1
        if self.first_audio is None:
            self.first_audio = now
            self.wake.set()
        self.last_audio = now
        if self.sample_bytes is not None:
            before, stalled = self.audio_s, self.playback.stall_s
            self.bytes += nbytes
            self.playback.receive(now, self.audio_s - before)
            self.stalls += int(self.playback.stall_s > stalled)
        else:
            self.bytes += nbytes

    def end(self, now: float, outcome: str, code: str | None = None, message: str | None = None) -> None:
        assert outcome in OUTCOMES and self.outcome is None
        self.outcome, self.code, self.message, self.ended_at = outcome, code, message, now
        self.wake.set()
        self.ended.set()


@dataclass
class ConnectionLog:
    """One connection: its turns, and what happened outside them."""

    turns: list[Turn] = field(default_factory=list)
    ready: dict | None = None
    errors: dict[str, int] = field(default_factory=dict)  # handshake, config, connection-level, client side
    samples: list[str] = field(default_factory=list)
    close_code: int | None = None
    unknown_turn_frames: int = 0
    bad_frames: int = 0
    late_events: int = 0  # an event for no open turn (e.g. cancelled after a cancel lost its race to done)
    last_error: str | None = None

    def error(self, code: str, message: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        self.last_error = code
        if len(self.samples) < 5:
            self.samples.append(f"{code}: {message}")

    def open_turn(self, turn_id: str) -> Turn | None:
        for turn in reversed(self.turns):
            if turn.turn_id == turn_id:
                return turn
        return None

    def on_frame(self, now: float, data: bytes) -> None:
        try:
            frame = parse_audio_frame(data)  # the protocol's one client-side parser
        except ProtocolError:
            self.bad_frames += 1
            return
        turn = self.open_turn(frame.turn_id)
        if turn is None:
            self.unknown_turn_frames += 1
        else:
            turn.on_audio(now, frame.seq, len(frame.data))

    def on_event(self, now: float, text: str) -> None:
        try:
            event = json.loads(text)
            kind, turn_id = event["type"], event.get("turn_id")
        except (ValueError, KeyError, TypeError, AttributeError):
            self.error("bad_event", text[:200])
            return
        turn = self.open_turn(turn_id) if turn_id is not None else None
        if kind == "error" and turn_id is None:
            self.error(str(event.get("code")), str(event.get("message")))
        elif turn is None or (turn.outcome is not None and kind in ("done", "cancelled", "error")):
            self.late_events += 1
        elif kind == "piece":
            turn.pieces += 1
        elif kind == "done":
            turn.done = event
            turn.end(now, "done")
        elif kind == "cancelled":
            turn.end(now, "cancelled")
        elif kind == "error":
            turn.end(now, "error", str(event.get("code")), str(event.get("message")))

    def closed(self, now: float, code: int | None) -> None:
        self.close_code = code
        for turn in self.turns:
            if turn.outcome is None:
                turn.end(now, "lost", "connection_closed",
                         f"connection closed ({code})" + (f" after error {self.last_error}" if self.last_error else ""))
