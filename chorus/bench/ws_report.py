"""The voice-agent bench's report: a level's figures from its connections' logs (:func:`summarize`;
docs/benchmarks.md, "Voice-agent latency", explains every field) and its progress line."""
from __future__ import annotations

import sys

from chorus.bench.online_bench import _pct
from chorus.bench.ws_turn import OUTCOMES, SAMPLE_BYTES, ConnectionLog, Turn


def _pcts(values: list[float]) -> dict:
    return {"p50": _pct(values, 50), "p90": _pct(values, 90), "p99": _pct(values, 99), "max": _pct(values, 100)}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _turn_timings(turn: Turn) -> dict:
    """The ``timings`` of the turn's ``done`` event ({} without one)."""
    return (turn.done or {}).get("timings") or {}


def _timing(turn: Turn, key: str) -> float | None:
    return _number(_turn_timings(turn).get(key))


def _timings(turns: list[Turn], key: str) -> list[float]:
    return [v for t in turns if (v := _timing(t, key)) is not None]


# the server's split of a turn's first piece (``done``'s ``timings.first_piece``), seconds from its cut
FIRST_PIECE_TIMINGS = ("submitted_s", "first_token_s", "first_window_s", "first_pass_s", "first_audio_s")


def _first_piece(turns: list[Turn], key: str) -> list[float]:
    split = [_turn_timings(t).get("first_piece") or {} for t in turns]
    return [v for s in split if (v := _number(s.get(key))) is not None]


def summarize(concurrency: int, turns_each: int, logs: list[ConnectionLog], wall_s: float, fmt: str) -> dict:
    """The per-level figures of the report (docs/benchmarks.md, "Voice-agent latency")."""
    turns = [t for log in logs for t in log.turns]
    counts = {o: sum(1 for t in turns if t.outcome == o) for o in OUTCOMES}
    counts["not_run"] = concurrency * turns_each - len(turns)
    done = [t for t in turns if t.outcome == "done"]
    heard = [(t, t.first_audio - t.first_delta) for t in turns if t.first_audio is not None and t.first_delta]
    first_audio = [s for _, s in heard]
    by_turn = {"first": [s for t, s in heard if t.index == 0], "later": [s for t, s in heard if t.index > 0]}
    waits = [(t, _timing(t, "threshold_wait_s")) for t in done if t.first_audio is not None and t.first_delta]
    added = [t.first_audio - t.first_delta - w for t, w in waits if w is not None]
    flush_to_last = [t.last_audio - t.flushed for t in done if t.last_audio is not None and t.flushed is not None]
    codes: dict[str, int] = {}
    for key in [t.code for t in turns if t.outcome in ("error", "lost")] + \
            [c for log in logs for c, n in log.errors.items() for _ in range(n)]:
        codes[key] = codes.get(key, 0) + 1
    closes: dict[str, int] = {}
    for log in logs:
        closes[str(log.close_code)] = closes.get(str(log.close_code), 0) + 1
    measured = fmt in SAMPLE_BYTES
    played = [t for t in done if t.frames]
    cancels = [t for t in turns if t.cancel_sent is not None]
    cancelled = [t for t in cancels if t.outcome == "cancelled"]
    samples = [f"{t.turn_id} {t.outcome} {t.code}: {t.message}" for t in turns if t.outcome in ("error", "lost")]
    return {
        "connections": concurrency, "turns_per_connection": turns_each,
        "ready": sum(1 for log in logs if log.ready is not None), "turns": counts,
        "error_codes": codes, "error_samples": (samples + [s for log in logs for s in log.samples])[:5],
        "close_codes": closes, "wall_s": round(wall_s, 3),
        "first_audio_s": _pcts(first_audio),
        # each connection's first turn apart from its later ones: without a ramp the N first turns
        # start within one token interval of each other, the level's burst
        "first_audio_s_by_turn": {part: _pcts(values) for part, values in by_turn.items()},
        "threshold_wait_s": _pcts([w for _, w in waits if w is not None]),
        "server_added_s": _pcts(added),
        "server_first_audio_s": _pcts(_timings(done, "first_text_to_first_audio_s")),
        "server_first_piece_s": {key: _pcts(_first_piece(done, key)) for key in FIRST_PIECE_TIMINGS},
        "flush_to_last_audio_s": _pcts(flush_to_last),
        "server_flush_to_last_audio_s": _pcts(_timings(done, "flush_to_last_audio_s")),
        "pieces_per_turn": _pcts([t.pieces for t in done]),
        "frames": sum(t.frames for t in turns), "bytes": sum(t.bytes for t in turns),
        "audio_s": round(sum(t.audio_s for t in turns), 3) if measured else None,
        "done_turns_audio_s": {  # the audio of done turns as received, and as their done events say
            "client": round(sum(t.audio_s for t in done), 3) if measured else None,
            "server": round(sum(float(t.done.get("audio_seconds") or 0.0) for t in done), 3)},
        "throughput_audio_s_per_s":
            round(sum(t.audio_s for t in turns) / wall_s, 3) if measured and wall_s > 0 else None,
        "stalls": None if not measured else {
            "turns_measured": len(played), "turns_with_stall": sum(1 for t in played if t.stalls),
            "count": sum(t.stalls for t in played), "stall_s": _pcts([t.playback.stall_s for t in played]),
        },
        "cancel": {
            "sent": len(cancels), "cancelled": len(cancelled),
            "done_first": sum(1 for t in cancels if t.outcome == "done"),
            "to_cancelled_s": _pcts([t.ended_at - t.cancel_sent for t in cancelled]),
            "to_last_audio_s": _pcts([max(0.0, t.last_audio - t.cancel_sent) for t in cancelled]),
            "frames_after_cancel_sent": sum(t.frames_after_cancel_sent for t in cancels),
            "frames_after_cancelled": sum(t.frames_after_end for t in cancelled),
        },
        "protocol_errors": {
            "seq": sum(t.seq_errors for t in turns),
            "frames_after_done": sum(t.frames_after_end for t in done),
            "frames_after_cancelled": sum(t.frames_after_end for t in cancelled),
            "frames_of_unknown_turns": sum(log.unknown_turn_frames for log in logs),
            "bad_frames": sum(log.bad_frames for log in logs),
            "late_events": sum(log.late_events for log in logs),
        },
        "send_lag_s": _pcts([t.send_lag_s for t in turns if t.first_delta is not None]),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f} ms"


def progress_line(level: dict) -> None:
    """A level's summary on stderr, as the run goes."""
    turns, stalls, cancel = level["turns"], level["stalls"], level["cancel"]
    planned = sum(turns.values())
    stall = "-" if stalls is None else f"{stalls['turns_with_stall']}/{stalls['turns_measured']} turns stalled"
    cancels = f"; cancel->cancelled p99 {_ms(cancel['to_cancelled_s']['p99'])}" if cancel["sent"] else ""
    # by code: a refusal (overloaded) is not an error of the run, and the first audio counts neither
    codes = ", ".join(f"{code} {n}" for code, n in sorted(level["error_codes"].items()))
    print(f"connections {level['connections']}: {turns['done']}/{planned} turns done, {turns['cancelled']} cancelled, "
          f"{turns['error'] + turns['lost'] + turns['not_run']} failed{f' ({codes})' if codes else ''}; "
          f"first audio p50 "
          f"{_ms(level['first_audio_s']['p50'])} p99 {_ms(level['first_audio_s']['p99'])} (server-added p99 "
          f"{_ms(level['server_added_s']['p99'])}); flush->last audio p99 "
          f"{_ms(level['flush_to_last_audio_s']['p99'])}; {stall}{cancels}; {level['wall_s']:.1f} s", file=sys.stderr)
