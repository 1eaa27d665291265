"""The voice-agent WebSocket (WS /v1/audio/speech/stream) against a live server over tiny models."""
from __future__ import annotations

import numpy as np
import pytest

from tests.server.live import LiveServer, server_config, tiny_loader
from tests.server.ws_client import collect, configure, connect, send

pytestmark = pytest.mark.timeout(120)

TEXT = "Hello there, this is a test. It has two sentences."


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), canary_interval_s=3600.0)
    with LiveServer(config, tiny_loader(config)) as live:
        yield live


def test_text_then_flush_gives_pieces_audio_frames_and_done(server):
    with connect(server) as ws:
        ready = configure(ws)
        assert ready["sample_rate"] == 24_000 and ready["response_format"] == "pcm"
        send(ws, type="text", turn_id="t1", text=TEXT)
        send(ws, type="flush", turn_id="t1")
        turn = collect(ws, ["t1"])["t1"]
    done = turn.of("done")
    assert len(done) == 1 and not turn.of("error"), turn.events
    pieces = turn.of("piece")
    assert [p["piece"] for p in pieces] == list(range(len(pieces))) and pieces
    assert [f[0]["seq"] for f in turn.frames] == list(range(len(turn.frames)))
    for p in pieces:
        assert TEXT[p["char_start"]:p["char_end"]] == p["text"]
    samples = np.frombuffer(turn.audio, dtype="<i2")
    assert samples.size > 0 and len(turn.audio) % 2 == 0
    assert done[0]["audio_seconds"] == pytest.approx(samples.size / 24_000, abs=1e-5)
    usage = done[0]["usage"]
    assert usage["output_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    timings = done[0]["timings"]
    assert timings["first_text_to_first_audio_s"] > 0 and timings["flush_to_last_audio_s"] >= 0
    assert timings["threshold_wait_s"] >= 0
