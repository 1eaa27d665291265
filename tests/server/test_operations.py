"""Health, readiness (canary, stalled engine, failed start-up), metrics and logs."""
from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from chorus.server.logs import JsonFormatter, request_id_var, setup_logging
from chorus.server.service import Loaded
from chorus.server.config import ServerConfig
from tests.server.live import EnginePause, LiveServer, VocoderPause, metric, server_config, tiny_loader, until


def test_health_and_ready_answer_when_loaded(server):
    assert server.client.get("/health").json() == {"status": "ok"}
    ready = server.client.get("/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True and ready.json()["state"] == "ready"


def test_ready_fails_while_the_engine_is_stalled_and_recovers(tmp_path):
    config = server_config(tmp_path, stall_timeout_s=0.3)
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with EnginePause(server) as pause:
            future = pool.submit(httpx.post, f"{server.url}/v1/audio/speech", timeout=60,
                                 json={"model": "chatterbox-turbo", "input": "Hi.", "response_format": "pcm"})
            assert pause.entered.wait(10)
            # the step is held: /ready must turn 503 after stall_timeout_s. "No progress" may say
            # so first (its clock can start before the step's); the held step's own reason takes
            # over once the step has run that long, and is what this test waits for
            deadline = time.monotonic() + 30
            while "T3 step" not in ((ready := server.client.get("/ready")).json().get("reason") or ""):
                assert ready.status_code == 200 or "no T3 token" in ready.json()["reason"], ready.json()
                assert time.monotonic() < deadline, "/ready never reported the stalled step"
                time.sleep(0.05)
            assert ready.status_code == 503 and ready.json()["ready"] is False
            assert server.client.get("/health").status_code == 200  # alive, just not ready
        assert future.result().status_code == 200
        assert server.client.get("/ready").status_code == 200


def _held_vocoder_pass(server, pool):
    """A speech request whose first vocoder pass is held (the pause must be entered already)."""
    return pool.submit(httpx.post, f"{server.url}/v1/audio/speech", timeout=60,
                       json={"model": "chatterbox-turbo", "input": "Hi.", "response_format": "pcm"})


def test_a_vocoder_pass_within_its_predicted_time_is_busy_not_stalled(tmp_path):
    # a pass over many streams on a loaded CPU takes seconds: load, not a reason to be unready
    config = server_config(tmp_path, stall_timeout_s=0.3)
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(1) as pool:
        stage = server.pipeline.vocoder
        stage.cost.flow_per_token = 1.0  # as if measured: this pass is predicted to take minutes
        with VocoderPause(server) as pause:
            future = _held_vocoder_pass(server, pool)
            assert pause.entered.wait(10)
            assert stage.expected_pass_seconds > 10
            held_since = time.monotonic()
            while time.monotonic() - held_since < 4 * config.stall_timeout_s:  # well past the timeout
                ready = server.client.get("/ready")
                assert ready.status_code == 200, ready.json()
                time.sleep(0.05)
        assert future.result().status_code == 200


def test_a_vocoder_pass_past_its_predicted_time_makes_ready_fail_until_it_ends(tmp_path):
    config = server_config(tmp_path, stall_timeout_s=0.3)
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(1) as pool:
        stage = server.pipeline.vocoder
        stage.cost.flow_per_token = stage.cost.hift_per_frame = 1e-6  # a pass predicted at well under the timeout
        with VocoderPause(server) as pause:
            future = _held_vocoder_pass(server, pool)
            assert pause.entered.wait(10)
            until(lambda: "vocoder pass" in (server.client.get("/ready").json().get("reason") or ""),
                  what="/ready to report the held pass")
            ready = server.client.get("/ready")
            assert ready.status_code == 503 and "predicted: 0.0 s" in ready.json()["reason"]
        assert future.result().status_code == 200
        until(lambda: server.client.get("/ready").status_code == 200, what="/ready to recover")


def test_a_failed_start_up_is_reported_not_hidden(tmp_path):
    def broken(config: ServerConfig) -> Loaded:
        raise FileNotFoundError("no checkpoint at /nowhere")

    with LiveServer(server_config(tmp_path), broken, wait_ready=False) as server:
        deadline = time.monotonic() + 10
        while server.service.state != "failed":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        ready = server.client.get("/ready")
        assert ready.status_code == 503 and "no checkpoint" in ready.json()["reason"]
        speech = server.speech(input="Hi.")
        assert speech.status_code == 503 and speech.json()["error"]["code"] == "not_ready"
        assert "retry-after" in speech.headers


def test_a_canary_that_fails_in_a_model_step_makes_ready_fail_until_one_passes(tmp_path):
    config = server_config(tmp_path)
    with LiveServer(config, tiny_loader(config)) as server:
        runner = server.pipeline.engine.runner
        original = runner.add_request

        def fail_canaries(request_id, *args, **kwargs):
            if request_id.startswith("canary-"):
                raise ValueError("injected canary failure")
            return original(request_id, *args, **kwargs)

        runner.add_request = fail_canaries
        try:
            asyncio.run_coroutine_threadsafe(server.service.run_canary(), server.loop).result(30)
        finally:
            runner.add_request = original
        ready = server.client.get("/ready")
        assert ready.status_code == 503 and "canary" in ready.json()["reason"]
        asyncio.run_coroutine_threadsafe(server.service.run_canary(), server.loop).result(30)
        assert server.client.get("/ready").status_code == 200


def test_metrics_move_with_requests(server):
    before = server.client.get("/metrics").text
    assert server.speech(input="Hello there.", response_format="pcm").status_code == 200
    moving = (("chorus_requests_total", 'status="ok"'), ("chorus_audio_seconds_total", ""),
              ("chorus_time_to_first_audio_seconds_count", ""), ("chorus_request_duration_seconds_count", ""),
              ("chorus_queue_time_seconds_count", ""), ("chorus_t3_tokens_total", ""),
              ("chorus_vocoder_passes_total", ""))
    after = ""

    def moved() -> bool:  # the engine's counters follow at the monitor's next tick
        nonlocal after
        after = server.client.get("/metrics").text
        return all(metric(after, name, labels) > metric(before, name, labels) for name, labels in moving)

    until(moved, what="every request metric to move")
    for name in ("chorus_kv_blocks", "chorus_prefix_cache_hit_rate", "chorus_preemptions_total", "chorus_queue_depth",
                 "chorus_degradation_level", "chorus_t3_tokens_per_second", "chorus_t3_batch_rows",
                 "chorus_errors_total", "chorus_ready"):
        assert name in after, name
    assert metric(after, "chorus_ready") == 1
    assert metric(after, "chorus_prefix_cache_hit_rate") > 0  # the built-in voice's prefix is shared


def test_vocoder_metrics_say_how_its_calls_ran_and_what_it_captured_while_serving(server):
    before = server.client.get("/metrics").text
    assert server.speech(input="Hello there.", response_format="pcm").status_code == 200
    eager = ("chorus_vocoder_calls_total", 'mode="eager"')
    after = ""

    def moved() -> bool:  # the engine's counters follow at the monitor's next tick
        nonlocal after
        after = server.client.get("/metrics").text
        return metric(after, *eager) >= metric(before, *eager) + 2  # a pass is a flow call and a HiFT call

    until(moved, what="the vocoder's eager calls to move")
    # the CPU has no CUDA graphs: nothing replayed, nothing captured after warm-up (series exported at 0)
    lines = after.splitlines()
    assert any(line.startswith("chorus_vocoder_calls_total{") and 'mode="graph"' in line for line in lines)
    for mode in ("graph", "covered"):
        assert metric(after, "chorus_vocoder_calls_total", f'mode="{mode}"') == 0
    assert any(line.startswith("chorus_vocoder_serving_graph_captures_total") for line in lines)
    assert metric(after, "chorus_vocoder_serving_graph_captures_total") == 0
    assert metric(after, "chorus_vocoder_serving_graph_capture_seconds_total") == 0


def test_errors_are_counted_by_type(server):
    before = metric(server.client.get("/metrics").text, "chorus_errors_total", 'type="voice_not_found"')
    server.speech(input="Hi.", voice="missing")
    after = metric(server.client.get("/metrics").text, "chorus_errors_total", 'type="voice_not_found"')
    assert after == before + 1


def test_json_logs_carry_the_request_id():
    record = logging.LogRecord("chorus.server", logging.INFO, __file__, 1, "served %s", ("x",), None)
    token = request_id_var.set("req-abc")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)
    assert line["request_id"] == "req-abc" and line["message"] == "served x" and line["level"] == "info"


def test_json_logs_keep_nested_extra_data_as_json():
    record = logging.LogRecord("chorus.server", logging.INFO, __file__, 1, "starting", (), None)
    record.config = {"port": 8000, "cors_origins": ("https://a.example",), "degradation": {"enabled": True}}
    record.path = Path("/tmp")
    line = json.loads(JsonFormatter().format(record))
    assert line["config"] == {"port": 8000, "cors_origins": ["https://a.example"], "degradation": {"enabled": True}}
    assert line["path"] == "/tmp"


def test_uvicorns_coloured_copy_of_a_message_is_not_logged_as_a_field():
    from chorus.server.logs import TextFormatter

    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (7,), None)
    record.color_message = "Started server process [\x1b[36m%d\x1b[0m]"
    assert "color_message" not in TextFormatter().format(record)
    assert "color_message" not in json.loads(JsonFormatter().format(record))


def test_openapi_schema_describes_the_api(server):
    schema = server.client.get("/openapi.json").json()
    for path in ("/v1/audio/speech", "/v1/voices", "/v1/voices/{voice_id}", "/v1/models", "/health", "/ready",
                 "/metrics"):
        assert path in schema["paths"], path


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_log_format_carries_the_request_id(server, fmt):
    """``--log-format text`` (what scripts/serve.sh uses) as well as JSON: the request's lines,
    the access line among them, name the client's X-Request-Id."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        setup_logging(fmt, "info")
        root.handlers[0].setStream(stream)
        response = server.client.post(
            "/v1/audio/speech", json={"model": "chatterbox-turbo", "input": "Hi.", "voice": "missing"},
            headers={"X-Request-Id": "my-req-1"})
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert response.headers["x-request-id"] == "my-req-1"
    lines = [line for line in stream.getvalue().splitlines() if "POST /v1/audio/speech 400" in line]
    assert lines and all("my-req-1" in line for line in lines), stream.getvalue()
