"""The per-request audio checks through a live server over tiny models (docs/quality.md): every
request's checks reach /metrics, a response sent whole names its flags in a header, the SSE and
WebSocket ``done`` messages carry them, and a flagged request is logged with its id.

The tiny models speak at most 12 tokens (0.48 s) per chunk of at most 60 characters, so a long
text is spoken far faster than a trained model would: ``too_short``, a real flag of real audio."""
from __future__ import annotations

import json
import logging
import os

import pytest

from chorus.quality.checks import REASONS
from chorus.quality.dnsmos import available as dnsmos_available
from tests.server.live import LiveServer, metric, server_config, tiny_loader, until
from tests.server.ws_client import collect, configure, connect, send

pytestmark = pytest.mark.timeout(120)

LONG = " ".join(f"Sentence number {i} is here." for i in range(8))  # 8 chunks: 3.8 s for 215 characters


def _metrics(server) -> str:
    return server.client.get("/metrics").text


def test_every_check_is_a_histogram_by_model_and_flags_count_by_reason(server):
    before = metric(_metrics(server), "chorus_audio_checked_requests_total")
    assert server.speech(input="Hello there.", response_format="pcm").status_code == 200
    text = _metrics(server)
    assert metric(text, "chorus_audio_checked_requests_total") == before + 1
    labels = 'model="chatterbox-turbo"'
    for name in ("chorus_audio_clipped_ratio", "chorus_audio_silent_ratio", "chorus_audio_rms_dbfs",
                 "chorus_audio_seconds_per_char", "chorus_audio_token_loop_tokens"):
        assert metric(text, f"{name}_count", labels) == before + 1, name
    for reason in REASONS:
        assert f'chorus_audio_flagged_requests_total{{model="chatterbox-turbo",reason="{reason}"' in text


def test_a_response_sent_whole_names_its_flags_in_a_header(server, caplog):
    before = metric(_metrics(server), "chorus_audio_flagged_requests_total", 'reason="too_short"')
    with caplog.at_level(logging.WARNING, logger="chorus.server"):
        answer = server.speech(input=LONG, response_format="wav")
    assert answer.status_code == 200
    assert answer.headers["X-Chorus-Quality-Flags"].split(",").count("too_short") == 1
    assert metric(_metrics(server), "chorus_audio_flagged_requests_total", 'reason="too_short"') == before + 1
    request_id = answer.headers["X-Request-Id"]
    flagged = [r for r in caplog.records if r.getMessage().startswith("audio flagged")]
    assert [getattr(r, "request_id", None) for r in flagged] == [request_id]
    assert "too_short" in flagged[0].flags


def test_the_sse_done_event_carries_the_checks(server):
    answer = server.speech(input=LONG, response_format="pcm", stream_format="sse")
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    quality = done["quality"]
    assert "too_short" in quality["flags"] and quality["audio_seconds"] > 0
    assert set(quality) == {"audio_seconds", "clipped_ratio", "silent_ratio", "rms_dbfs", "seconds_per_char",
                            "loop_tokens", "flags"}
    assert "X-Chorus-Quality-Flags" not in answer.headers  # streamed: the headers left before the audio


def test_the_websocket_done_message_carries_each_pieces_checks(server):
    with connect(server) as ws:
        configure(ws)
        send(ws, type="text", turn_id="q1", text="Hello there, this is a test. It has two sentences.")
        send(ws, type="flush", turn_id="q1")
        turn = collect(ws, ["q1"])["q1"]
    done = turn.of("done")[0]
    pieces = turn.of("piece")
    assert len(done["quality"]["pieces"]) == len(pieces) >= 1
    assert set(done["quality"]["flags"]) == {f for p in done["quality"]["pieces"] for f in p["flags"]}


@pytest.mark.skipif(not dnsmos_available(), reason="chorus-tts[quality] is not installed")
def test_sampled_requests_get_dnsmos_scores_by_cfg_and_exaggeration_bucket(tmp_path):
    config = server_config(tmp_path, quality_sample_rate=1.0)
    with LiveServer(config, tiny_loader(config)) as live:
        assert live.speech(input="Hello there.", response_format="pcm").status_code == 200

        def scored() -> float:
            return metric(live.client.get("/metrics").text, "chorus_dnsmos_score_count", 'score="ovrl"')

        until(lambda: scored() == 1, what="the DNSMOS score of the request")
        text = live.client.get("/metrics").text
        for score in ("sig", "bak", "ovrl"):
            assert metric(text, "chorus_dnsmos_score_count", f'score="{score}"') == 1
        line = next(x for x in text.splitlines() if x.startswith("chorus_dnsmos_score_count"))
        assert 'cfg_weight="' in line and 'exaggeration="' in line
        assert metric(text, "chorus_dnsmos_scoring_seconds_count") == 1
        assert metric(text, "chorus_dnsmos_worker_up") == 1


@pytest.mark.skipif(not dnsmos_available(), reason="chorus-tts[quality] is not installed")
def test_shutdown_stops_the_dnsmos_worker_process(tmp_path):
    config = server_config(tmp_path, quality_sample_rate=1.0)
    with LiveServer(config, tiny_loader(config)) as live:
        pid = live.service.sampler.worker_pid
        os.kill(pid, 0)  # running
    with pytest.raises(ProcessLookupError):  # gone and reaped (a dead child not yet reaped still has its id)
        os.kill(pid, 0)


def test_without_sampling_the_dnsmos_metrics_are_absent(server):
    assert "chorus_dnsmos" not in server.client.get("/metrics").text
