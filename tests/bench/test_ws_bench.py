"""``chorus bench online --agent``: voice agents over the WebSocket of a real server of tiny models
on the CPU (the report's fields, barge-in, the command line), and its pure parts (the LLM-like
tokens, their schedule, the frame header, stalls, the level summary)."""
from __future__ import annotations

import asyncio
import json
import random
import struct

import pytest

from chorus.bench.online_bench import DEFAULT_TEXT
from chorus.bench.ws_bench import (AgentBenchConfig, first_turn_phase, llm_tokens, run_agent, run_connection,
                                   token_times, turn_gap)
from chorus.bench.ws_report import progress_line, summarize
from chorus.bench.ws_turn import OUTCOMES, ConnectionLog, Turn
from chorus.cli import main
from tests.server.live import LiveServer, server_config, tiny_loader

TEXT = "Hello there, this is a load test."
TIMEOUT_S = 15  # per turn: a turn the server never ends fails its test as "lost", well before the test's timeout
# barge-in: the first sentence is spoken while the rest still streams in (10 tokens a second)
LONG_TEXT = ("Hello there, this is a barge-in test. The agent keeps talking for a while, and the caller "
             "interrupts it as soon as its first words are heard, so nothing more of it is spoken.")


@pytest.fixture(scope="module")
def live(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"))
    with LiveServer(config, tiny_loader(config)) as server:
        yield server


def frame(turn_id: str, seq: int, audio: bytes) -> bytes:
    header = json.dumps({"turn_id": turn_id, "seq": seq}).encode()
    return struct.pack(">H", len(header)) + header + audio


def samples(seconds: float, rate: int = 24_000) -> bytes:
    return bytes(2 * round(seconds * rate))  # s16le


# ---------------------------------------------------------------------------------- pure parts

def test_the_reply_is_streamed_as_llm_like_tokens():
    tokens = llm_tokens(DEFAULT_TEXT)
    assert "".join(tokens) == DEFAULT_TEXT and len(tokens) == 28  # 26 words, a comma and a full stop
    assert tokens[:4] == ["The", " quick", " brown", " fox"] and tokens[-2:] == [" down", "."]
    assert llm_tokens("an extraordinary day!") == ["an", " extra", "ordin", "ary", " day", "!"]
    assert llm_tokens(" trailing space ") == [" trailing", " space", " "]


def test_deltas_are_due_at_the_llm_rate():
    fixed = token_times(5, 50.0, "fixed", random.Random(0))
    assert fixed == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08])
    poisson = token_times(2000, 50.0, "poisson", random.Random(7))
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert poisson[0] == 0.0 and min(gaps) >= 0 and sum(gaps) / len(gaps) == pytest.approx(0.02, rel=0.1)
    assert len(set(round(g, 6) for g in gaps)) > 1000  # not evenly spaced
    assert token_times(2000, 50.0, "poisson", random.Random(7)) == poisson  # the seed fixes them


def test_a_stall_is_a_frame_later_than_the_audio_ahead_of_real_time():
    turn = Turn("t", sample_bytes=2, rate=24_000)
    # 0.5 s at 10.0, then 0.5 s at 10.4 (in time: 0.1 s ahead), 1 s at 11.3 (0.3 s late: playback
    # ran dry at 11.0), 1 s at 12.3 (in time: it ends at 11.3 + 1.0 = 12.3)
    for seq, (now, seconds) in enumerate(((10.0, 0.5), (10.4, 0.5), (11.3, 1.0), (12.3, 1.0))):
        turn.on_audio(now, seq, len(samples(seconds)))
    assert turn.audio_s == pytest.approx(3.0) and turn.frames == 4 and turn.seq_errors == 0
    assert turn.stalls == 1 and turn.playback.stall_s == pytest.approx(0.3)


def test_seq_gaps_and_frames_after_the_end_are_counted():
    turn = Turn("t", sample_bytes=2)
    for seq in (0, 1, 3, 4, 4):
        turn.on_audio(1.0, seq, 2)
    assert turn.seq_errors == 2 and turn.frames == 5  # 1 -> 3 and 4 -> 4
    turn.end(2.0, "cancelled")
    turn.on_audio(2.1, 5, 2)
    assert turn.frames == 5 and turn.frames_after_end == 1


def _level_of_events() -> list[ConnectionLog]:
    """Two connections as the reader files a server's answers: turn a0 done, a1 cancelled after
    its first frame, b0 an error, b1 lost when the connection closed; one turn never ran."""
    a, b = ConnectionLog(ready={"type": "ready"}), ConnectionLog(ready={"type": "ready"})
    t0 = Turn("a0", sample_bytes=2, first_delta=1.0, flushed=1.5)
    a.turns.append(t0)
    a.on_event(1.1, json.dumps({"type": "piece", "turn_id": "a0", "piece": 0, "text": "x"}))
    a.on_frame(1.3, frame("a0", 0, samples(0.5)))
    a.on_frame(1.9, frame("a0", 1, samples(0.5)))
    a.on_event(2.0, json.dumps({"type": "done", "turn_id": "a0", "audio_seconds": 1.0, "usage": {}, "timings": {
        "first_text_to_first_audio_s": 0.28, "flush_to_last_audio_s": 0.39, "threshold_wait_s": 0.2}}))
    t1 = Turn("a1", 1, cancel_planned=True, sample_bytes=2, first_delta=3.0)
    a.turns.append(t1)
    a.on_frame(3.4, frame("a1", 0, samples(0.1)))
    t1.cancel_sent = 3.41
    a.on_frame(3.42, frame("a1", 1, samples(0.1)))
    a.on_event(3.45, json.dumps({"type": "cancelled", "turn_id": "a1"}))
    a.on_event(3.46, json.dumps({"type": "error", "turn_id": "a1", "code": "turn_closed", "message": "late"}))
    a.closed(4.0, 1000)
    b.turns.append(Turn("b0", sample_bytes=2, first_delta=1.0))
    b.on_event(1.2, json.dumps({"type": "error", "turn_id": "b0", "code": "synthesis_failed", "message": "boom",
                                "status": 500, "retry_after_s": None}))
    b.turns.append(Turn("b1", 1, sample_bytes=2, first_delta=2.0))
    b.on_frame(2.5, b"\x00")
    b.on_event(2.6, json.dumps({"type": "error", "turn_id": None, "code": "server_draining", "message": "bye"}))
    b.closed(2.7, 1001)
    return [a, b]


def test_a_level_summary_counts_every_turn_once_and_subtracts_the_threshold_wait():
    level = summarize(2, 3, _level_of_events(), wall_s=4.0, fmt="pcm")
    assert json.loads(json.dumps(level)) == level
    assert level["turns"] == {"done": 1, "cancelled": 1, "error": 1, "lost": 1, "not_run": 2}
    assert set(level["turns"]) == set(OUTCOMES)
    assert level["error_codes"] == {"synthesis_failed": 1, "connection_closed": 1, "server_draining": 1}
    assert level["close_codes"] == {"1000": 1, "1001": 1} and level["ready"] == 2
    assert level["first_audio_s"]["p50"] == pytest.approx(0.35)  # a0 0.3 s, a1 0.4 s
    assert level["threshold_wait_s"]["max"] == pytest.approx(0.2)
    assert level["server_added_s"]["max"] == pytest.approx(0.1)  # a0: 0.3 - 0.2
    assert level["server_first_audio_s"]["max"] == pytest.approx(0.28)
    assert level["flush_to_last_audio_s"]["max"] == pytest.approx(0.4)  # 1.9 - 1.5
    assert level["pieces_per_turn"]["max"] == 1
    assert level["audio_s"] == pytest.approx(1.2) and level["frames"] == 4
    assert level["done_turns_audio_s"] == {"client": 1.0, "server": 1.0}
    assert level["throughput_audio_s_per_s"] == pytest.approx(0.3)
    # a0's second frame came 0.1 s after its first 0.5 s ran out
    assert level["stalls"]["turns_measured"] == 1 and level["stalls"]["turns_with_stall"] == 1
    assert level["stalls"]["stall_s"]["max"] == pytest.approx(0.1)
    cancel = level["cancel"]
    assert cancel["sent"] == cancel["cancelled"] == 1 and cancel["done_first"] == 0
    assert cancel["to_cancelled_s"]["max"] == pytest.approx(0.04)
    assert cancel["to_last_audio_s"]["max"] == pytest.approx(0.01)
    assert cancel["frames_after_cancel_sent"] == 1 and cancel["frames_after_cancelled"] == 0
    assert level["protocol_errors"] == {"seq": 0, "frames_after_done": 0, "frames_after_cancelled": 0,
                                        "frames_of_unknown_turns": 0, "bad_frames": 1, "late_events": 1}


def test_the_progress_line_names_the_failed_turns_codes(capsys):
    level = summarize(2, 3, _level_of_events(), wall_s=4.0, fmt="pcm")
    progress_line(level)
    assert "1/6 turns done, 1 cancelled, 4 failed (connection_closed 1, server_draining 1, synthesis_failed 1)" \
        in capsys.readouterr().err


def test_a_level_summary_splits_each_connection_s_first_turn_from_its_later_ones():
    by_turn = summarize(2, 3, _level_of_events(), wall_s=4.0, fmt="pcm")["first_audio_s_by_turn"]
    assert by_turn["first"]["max"] == pytest.approx(0.3)  # a0 (b0 failed before any audio)
    assert by_turn["later"]["max"] == pytest.approx(0.4)  # a1 (b1's only frame was malformed)


def test_a_ramp_spreads_the_connections_first_turns_over_its_length():
    cfg = AgentBenchConfig(url="http://127.0.0.1:1", ramp_s=2.0, llm_tokens_per_s=50.0)
    rng = random.Random(0)
    for i in range(4):  # 0, 0.5, 1.0, 1.5 s, each plus a phase within one 20 ms token interval
        assert 0.5 * i <= first_turn_phase(cfg, i, 4, rng) < 0.5 * i + 0.02
    without = AgentBenchConfig(url="http://127.0.0.1:1", llm_tokens_per_s=50.0)
    assert all(0 <= first_turn_phase(without, i, 4, rng) < 0.02 for i in range(4))  # the level's burst


def test_a_turn_gap_range_draws_each_gap_from_the_connection_s_seed():
    fixed = AgentBenchConfig(url="http://127.0.0.1:1", turn_gap_s=1.5)
    assert turn_gap(fixed, random.Random(0)) == 1.5
    spread = AgentBenchConfig(url="http://127.0.0.1:1", turn_gap_s=1.0, turn_gap_max_s=4.0)
    gaps = [turn_gap(spread, random.Random(7)) for _ in range(3)]
    assert gaps[0] == gaps[1] == gaps[2]  # the seed fixes the draw
    rng = random.Random(11)
    drawn = [turn_gap(spread, rng) for _ in range(2000)]  # one connection's gaps: uniform over [1, 4]
    assert 1.0 <= min(drawn) < 1.1 and 3.9 < max(drawn) <= 4.0
    assert sum(drawn) / len(drawn) == pytest.approx(2.5, rel=0.05)


def test_compressed_formats_are_counted_in_bytes_only():
    level = summarize(2, 3, _level_of_events(), wall_s=4.0, fmt="opus")
    assert level["audio_s"] is None and level["stalls"] is None and level["throughput_audio_s_per_s"] is None


def test_settings_the_mode_cannot_use_are_refused(capsys):
    url = "http://127.0.0.1:1"
    for bad in (dict(response_format="wav"), dict(turns=0), dict(llm_tokens_per_s=0), dict(cancel_fraction=1.5),
                dict(token_spacing="burst"), dict(chunking={"min_words": 3}), dict(url="ws://x"), dict(ramp_s=-1),
                dict(turn_gap_s=2.0, turn_gap_max_s=1.0)):
        with pytest.raises(ValueError):
            AgentBenchConfig(**{"url": url, **bad})
    assert AgentBenchConfig(url="https://h:1/").ws_url == "wss://h:1/v1/audio/speech/stream"
    assert main(["bench", "online", "--url", url, "--agent", "--duration-s", "5"]) == 2
    assert main(["bench", "online", "--url", url, "--turns", "2", "--cancel-fraction", "0.5"]) == 2
    assert main(["bench", "online", "--url", url, "--agent", "--chunking", "min_chars=x"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == ["chorus: error: --duration-s: not with --agent (it runs --turns turns on each connection)",
                      "chorus: error: --turns, --cancel-fraction: only with --agent",
                      "chorus: error: --chunking takes KEY=INT pairs separated by commas, got 'min_chars=x'"]


def test_an_unreachable_server_is_one_line(capsys):
    assert main(["bench", "online", "--agent", "--url", "http://127.0.0.1:1", "--model", "m", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("chorus: error: cannot open a WebSocket to ws://127.0.0.1:1/v1/audio/speech/stream")
    assert "\n" not in err


# ---------------------------------------------------------------------------------- a real server

def _pcts_ordered(p: dict) -> bool:
    return p["p50"] <= p["p90"] <= p["p99"] <= p["max"]


@pytest.mark.timeout(60)
def test_agents_report_every_turn(live):
    cfg = AgentBenchConfig(url=live.url, concurrency=(2,), turns=2, text=TEXT, llm_tokens_per_s=100.0,
                           timeout_s=TIMEOUT_S)
    report = run_agent(cfg)
    assert json.loads(json.dumps(report)) == report
    assert report["model"] == "chatterbox-turbo" and report["tokens_per_turn"] == len(llm_tokens(TEXT))
    assert report["warmup"] == {"turns": 1, "done": 1} and report["ready"]["sample_rate"] == 24_000
    (level,) = report["levels"]
    assert level["connections"] == level["ready"] == 2 and level["turns_per_connection"] == 2
    assert level["turns"] == {"done": 4, "cancelled": 0, "error": 0, "lost": 0, "not_run": 0}
    assert level["error_codes"] == {} and level["error_samples"] == [] and level["close_codes"] == {"1000": 2}
    assert set(level["protocol_errors"].values()) == {0}  # seq gapless, nothing after done, no stray event
    first, added, wait = level["first_audio_s"], level["server_added_s"], level["threshold_wait_s"]
    assert 0 < first["p50"] and _pcts_ordered(first) and first["max"] <= level["wall_s"]
    assert 0 <= wait["p50"] and _pcts_ordered(wait) and 0 < added["p50"] and _pcts_ordered(added)
    assert added["max"] <= first["max"] and wait["max"] < first["max"]
    # the server's own figure (it stamps a frame once its send returned, so it may end a little
    # after the client read the frame)
    assert 0 < level["server_first_audio_s"]["p50"] and _pcts_ordered(level["server_first_audio_s"])
    assert 0 < level["flush_to_last_audio_s"]["p50"] and _pcts_ordered(level["flush_to_last_audio_s"])
    assert level["pieces_per_turn"]["p50"] >= 1
    by_turn = level["first_audio_s_by_turn"]  # each connection's first turn, and its second
    assert by_turn["first"]["p50"] > 0 and by_turn["later"]["p50"] > 0
    assert max(by_turn["first"]["max"], by_turn["later"]["max"]) == first["max"]
    split = level["server_first_piece_s"]  # the server's split of the first piece's time, in order
    assert all(split[key]["p50"] is not None
               for key in ("submitted_s", "first_token_s", "first_window_s", "first_pass_s", "first_audio_s"))
    assert split["submitted_s"]["max"] <= split["first_audio_s"]["max"] <= added["max"] + 1e-3
    assert level["audio_s"] == pytest.approx(level["bytes"] / 2 / 24_000, abs=1e-3) and level["audio_s"] > 0
    assert level["done_turns_audio_s"]["client"] == pytest.approx(level["audio_s"], abs=1e-3)
    assert level["done_turns_audio_s"]["server"] == pytest.approx(level["audio_s"], abs=0.01)
    assert level["frames"] >= 4 and level["stalls"]["turns_measured"] == 4
    assert level["cancel"]["sent"] == 0 and level["send_lag_s"]["p50"] >= 0
    server = level["server"]
    assert "error" not in server, server
    assert server["ws_turns"] == 4 and server["audio_seconds"] == pytest.approx(level["audio_s"], abs=0.01)
    assert 0 <= server["ws_connections_open_max"] <= 2
    live.wait_idle()


@pytest.mark.timeout(60)
def test_a_barge_in_is_cancelled_and_no_frame_follows(live):
    cfg = AgentBenchConfig(url=live.url, concurrency=(1,), turns=2, text=LONG_TEXT, llm_tokens_per_s=10.0,
                           cancel_fraction=1.0, warmup=0, timeout_s=TIMEOUT_S)
    (level,) = run_agent(cfg)["levels"]
    assert level["turns"] == {"done": 0, "cancelled": 2, "error": 0, "lost": 0, "not_run": 0}, level["error_samples"]
    cancel = level["cancel"]
    assert cancel["sent"] == cancel["cancelled"] == 2 and cancel["done_first"] == 0
    assert 0 < cancel["to_cancelled_s"]["p50"] and _pcts_ordered(cancel["to_cancelled_s"])
    assert 0 <= cancel["to_last_audio_s"]["max"] <= cancel["to_cancelled_s"]["max"]
    assert cancel["frames_after_cancelled"] == 0
    # no text after the cancel (the server would answer turn_closed), nothing after cancelled
    assert set(level["protocol_errors"].values()) == {0} and level["close_codes"] == {"1000": 1}
    assert level["first_audio_s"]["max"] > 0 and level["stalls"]["turns_measured"] == 0
    live.wait_idle()  # the cancelled turns' work is gone: no request in the pipeline, no KV block used


@pytest.mark.timeout(60)
def test_a_listening_agent_starts_its_next_turn_once_the_last_ones_audio_has_played(live):
    cfg = AgentBenchConfig(url=live.url, concurrency=(1,), turns=2, text=TEXT, llm_tokens_per_s=100.0,
                           listen=True, turn_gap_s=0.05, warmup=0, timeout_s=TIMEOUT_S)
    log = ConnectionLog()
    asyncio.run(run_connection(cfg, "chatterbox-turbo", log, random.Random(0), 2, "c0"))
    first, second = log.turns
    assert first.outcome == second.outcome == "done" and first.audio_s > 0
    played = first.playback.first + first.playback.audio_s + first.playback.stall_s  # the player's end
    assert second.first_delta >= played + cfg.turn_gap_s > first.ended_at
    live.wait_idle()


@pytest.mark.timeout(60)
def test_the_command_line_prints_and_writes_the_report(live, tmp_path, capsys):
    out = tmp_path / "agent.json"
    assert main(["bench", "online", "--agent", "--url", live.url, "--concurrency", "1", "--turns", "1",
                 "--text", TEXT, "--llm-tokens-per-s", "200", "--token-spacing", "poisson", "--warmup", "0",
                 "--chunking", "min_chars=25,max_chars=150,max_wait_ms=400", "--timeout-s", str(TIMEOUT_S),
                 "--ramp-s", "0.1",
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert json.loads(out.read_text()) == report and [p.name for p in tmp_path.iterdir()] == ["agent.json"]
    assert report["benchmark"] == "online-agent" and report["token_spacing"] == "poisson"
    assert report["ramp_s"] == 0.1
    assert report["ready"]["chunking"] == report["chunking_requested"] == {"min_chars": 25, "max_chars": 150,
                                                                           "max_wait_ms": 400}
    assert "connections 1: 1/1 turns done" in captured.err  # a progress line per level
    assert report["levels"][0]["turns"]["done"] == 1
    live.wait_idle()


def test_a_refused_config_stops_the_run_before_the_levels(live, capsys):
    assert main(["bench", "online", "--agent", "--url", live.url, "--voice", "missing", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("chorus: error: the server refused the connection's config (voice_not_found")
    assert "\n" not in err


@pytest.mark.timeout(60)
def test_the_api_key_goes_with_the_handshake(tmp_path, capsys):
    key = "bench-key-0123"
    config = server_config(tmp_path, api_keys=(key,))
    with LiveServer(config, tiny_loader(config), api_key=key) as server:
        args = ["bench", "online", "--agent", "--url", server.url, "--concurrency", "1", "--turns", "1", "--text", TEXT,
                "--warmup", "1", "--quiet", "--timeout-s", str(TIMEOUT_S)]
        # refused at the warm-up's handshake (the model named: GET /v1/models would refuse first): one line
        assert main(args + ["--model", "chatterbox-turbo"]) == 2
        err = capsys.readouterr().err.strip()
        assert "refused the WebSocket handshake" in err and "(401" in err and "\n" not in err
        assert main(args + ["--api-key", key]) == 0  # the key on GET /v1/models and on the handshake
        report = json.loads(capsys.readouterr().out)
        assert report["model"] == "chatterbox-turbo" and report["levels"][0]["turns"]["done"] == 1
        server.wait_idle()
