"""Admission and fairness on a live server: 429 and 503 with Retry-After before any work,
deadlines, client disconnects that free everything, priorities, and degradation."""
from __future__ import annotations

import concurrent.futures
import json
import logging
import socket
import time

import httpx

from chorus.server.config import DegradationConfig
from tests.server.live import EnginePause, LiveServer, access_record, metric, server_config, tiny_loader, until

LONG_TEXT = " ".join(f"This is sentence number {i} of a long text." for i in range(12))


def _post(url: str, **body) -> httpx.Response:
    body.setdefault("model", "chatterbox-turbo")
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)


def _in_flight(server, n: int) -> None:
    deadline = time.monotonic() + 20
    while server.service.admission.in_flight < n:
        assert time.monotonic() < deadline, server.service.admission.in_flight
        time.sleep(0.02)


def test_a_full_queue_answers_429_with_retry_after_and_high_priority_still_gets_in(tmp_path):
    config = server_config(tmp_path, max_queue=3, retry_after_s=2)
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(4) as pool:
        with EnginePause(server):
            held = [pool.submit(_post, server.url, input="Hello there.", response_format="pcm") for _ in range(2)]
            _in_flight(server, 2)  # normal priority may fill 90% of 3 = 2 places
            rejected = server.speech(input="Hello there.", response_format="pcm")
            assert rejected.status_code == 429 and rejected.headers["retry-after"] == "2"
            assert rejected.json()["error"]["code"] == "queue_full"
            urgent = pool.submit(_post, server.url, input="Hello there.", response_format="pcm", priority="high")
            _in_flight(server, 3)
        assert all(f.result().status_code == 200 for f in held) and urgent.result().status_code == 200
        assert metric(server.client.get("/metrics").text, "chorus_errors_total", 'type="queue_full"') == 1


def test_a_request_its_priority_would_never_get_in_with_is_refused_before_the_route(tmp_path, caplog):
    config = server_config(tmp_path, max_queue=3, retry_after_s=2)
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(3) as pool, \
            caplog.at_level(logging.INFO, logger="chorus.server"):
        routed = []  # the requests that reached the speech route
        speech = server.service.speech
        server.service.speech = lambda body, *args, **kwargs: routed.append(body.priority) or speech(body, *args, **kwargs)
        with EnginePause(server):
            held = [pool.submit(_post, server.url, input="Hello there.", response_format="pcm") for _ in range(2)]
            _in_flight(server, 2)  # normal priority's share of the queue is taken
            del routed[:]
            refused = server.client.post("/v1/audio/speech", headers={"X-Request-Id": "early-1"},
                                         json={"model": "chatterbox-turbo", "input": "Hello there."})
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
            assert refused.headers["retry-after"] == "2" and refused.headers["x-request-id"] == "early-1"
            assert routed == []  # answered before FastAPI routed it
            # a body the server would answer 400 is never refused early: a 400 is not to be retried
            invalid = server.speech(input="Hello there.", speed=100.0)
            assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "speed"
            # high priority (from the body) still has room: it takes the full path and gets in
            urgent = pool.submit(_post, server.url, input="Hello there.", response_format="pcm", priority="high")
            _in_flight(server, 3)
            assert routed == ["high"]
        assert all(f.result().status_code == 200 for f in held) and urgent.result().status_code == 200
        metrics = server.client.get("/metrics").text
        assert metric(metrics, "chorus_admission_refusals_total", 'reason="queue_full"') == 1
        line = access_record(caplog, "POST /v1/audio/speech", request_id="early-1")
    assert line.status == 429 and line.error_code == "queue_full"  # the access line says what was answered


def test_only_a_caller_with_a_valid_key_is_refused_early(tmp_path):
    config = server_config(tmp_path, max_queue=3, api_keys=("early-key",))
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(2) as pool:
        auth = {"Authorization": "Bearer early-key"}
        body = {"model": "chatterbox-turbo", "input": "Hello there.", "response_format": "pcm"}
        with EnginePause(server):
            held = [pool.submit(httpx.post, f"{server.url}/v1/audio/speech", json=body, headers=auth, timeout=60)
                    for _ in range(2)]
            _in_flight(server, 2)
            assert server.client.post("/v1/audio/speech", json=body).status_code == 401  # no hint of the load
            assert server.client.post("/v1/audio/speech", json=body, headers=auth).status_code == 429
        assert all(f.result().status_code == 200 for f in held)


def test_memory_pressure_answers_503_with_retry_after(tmp_path):
    config = server_config(tmp_path, max_new_tokens=600, memory_pressure=0.5, max_queue=64)
    loader = tiny_loader(config, kv_cache_bytes=70 * 16 * 1024, max_num_seqs=8)  # room for ~2 long requests
    with LiveServer(config, loader) as server, concurrent.futures.ThreadPoolExecutor(8) as pool:
        flood = [pool.submit(_post, server.url, input="Hello there.", response_format="pcm", seed=i)
                 for i in range(8)]
        deadline, answer = time.monotonic() + 30, None
        while time.monotonic() < deadline:  # short high-priority probes, so each answers quickly
            answer = server.speech(input="Hello there.", response_format="pcm", max_new_tokens=5, priority="high")
            if answer.status_code == 503:
                break
            time.sleep(0.05)
        assert answer.status_code == 503, "no 503 while requests waited for KV memory"
        assert answer.json()["error"]["code"] == "memory_pressure" and answer.headers["retry-after"] == "1"
        assert all(f.result().status_code == 200 for f in flood)


def test_an_expired_deadline_is_a_timeout_error(server):
    response = server.speech(input=LONG_TEXT, response_format="pcm", deadline_s=0.01)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    server.wait_idle()


def test_a_client_that_disconnects_mid_stream_frees_every_block(tmp_path):
    # 12 sentences of up to 800 tokens each, run one chunk at a time; no canary after the first,
    # so the request below is the only one in the pipeline
    config = server_config(tmp_path, max_new_tokens=800, canary_interval_s=3600.0)
    with LiveServer(config, tiny_loader(config, max_num_seqs=1)) as server:
        server.wait_idle()
        # T3 may finish the first chunk (its audio is the first to come) and is then held, so how
        # fast it runs cannot decide what the hang-up saves
        with EnginePause(server, after_tokens=800):
            with server.client.stream("POST", "/v1/audio/speech", json={
                    "model": "chatterbox-turbo", "input": LONG_TEXT, "response_format": "pcm"}) as response:
                assert response.status_code == 200
                next(response.iter_raw())  # the first audio arrived; now hang up
            until(lambda: metric(server.client.get("/metrics").text, "chorus_requests_total",
                                 'status="client_disconnected"') == 1, what="the disconnect to be counted")
            until(lambda: server.pipeline.active_requests == 0, what="the request to leave the pipeline")
            tokens_at_hangup = server.pipeline.t3_tokens  # at most 800: T3 still had chunks to run
        server.wait_idle(timeout=60)
        # aborted, not run to the end: at most the step under way ran after the hang-up (one
        # token on the one T3 row), not the other chunks' thousands
        assert server.pipeline.t3_tokens - tokens_at_hangup <= 1
        assert server.service.admission.in_flight == 0
        assert not server.pipeline.vocoder.has_work()


def test_high_priority_overtakes_queued_low_priority_work(tmp_path):
    config = server_config(tmp_path, max_new_tokens=30, canary_interval_s=3600.0)  # no canary in the way
    loader = tiny_loader(config, max_num_seqs=1)  # one T3 row: everything else queues
    done: dict[str, float] = {}

    def run(name: str, priority: str):
        response = _post(server.url, input="Hello there.", response_format="pcm", priority=priority)
        assert response.status_code == 200
        done[name] = time.monotonic()

    with LiveServer(config, loader) as server, concurrent.futures.ThreadPoolExecutor(6) as pool:
        with EnginePause(server) as pause:
            futures = [pool.submit(run, f"low{i}", "low") for i in range(4)]
            _in_flight(server, 4)
            assert pause.entered.wait(10)
            futures.append(pool.submit(run, "high", "high"))
            _in_flight(server, 5)
            # the high request reaches the pipeline (its T3 submission follows in the same call);
            # the engine takes it before its next step
            until(lambda: server.pipeline.active_requests == 5, what="the high request's submission")
        for f in futures:
            f.result()
    order = sorted(done, key=done.get)
    assert order.index("high") <= 1, order  # only the low request already running may finish first


def test_priority_can_come_from_a_header(server):
    response = server.client.post("/v1/audio/speech", headers={"X-Chorus-Priority": "low"},
                                  json={"model": "chatterbox-turbo", "input": "Hi.", "response_format": "pcm"})
    assert response.status_code == 200
    bad = server.client.post("/v1/audio/speech", headers={"X-Chorus-Priority": "soon"},
                             json={"model": "chatterbox-turbo", "input": "Hi.", "response_format": "pcm"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"


def test_degradation_under_pressure_is_reported_and_undone(tmp_path):
    degradation = DegradationConfig(thresholds=(0.1, 0.2, 0.3), hysteresis=0.05, hold_s=0.0)
    config = server_config(tmp_path, max_queue=6, degradation=degradation)
    with LiveServer(config, tiny_loader(config)) as server, concurrent.futures.ThreadPoolExecutor(3) as pool:
        with EnginePause(server):
            held = [pool.submit(_post, server.url, input="Hello there.", response_format="pcm") for _ in range(2)]
            _in_flight(server, 2)  # pressure 2/6 = 0.33: above every threshold
            deadline = time.monotonic() + 10
            while server.service.degradation.level < 3:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert metric(server.client.get("/metrics").text, "chorus_degradation_level") == 3
            assert server.client.get("/ready").json()["degradation_level"] == 3
            # level 3 halves the queue to 3 places, 2 for normal priority: a third normal request is refused
            assert server.speech(input="Hi.", response_format="pcm").status_code == 429
            degraded = pool.submit(_post, server.url, input="Hi.", response_format="pcm", priority="high")
            _in_flight(server, 3)
        response = degraded.result()
        assert response.headers["x-chorus-degradation"] == "3"
        assert response.headers["x-chorus-degraded"] == "flow_steps=1"  # turbo has no CFG to turn off
        assert all(f.result().status_code == 200 for f in held)
        deadline = time.monotonic() + 10
        while server.service.degradation.level > 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_client_that_disconnects_before_its_first_audio_frees_its_request_at_once(tmp_path):
    config = server_config(tmp_path, max_new_tokens=200)
    with LiveServer(config, tiny_loader(config)) as server:
        with EnginePause(server) as pause:  # no first audio can come while the engine is held
            body = json.dumps({"model": "chatterbox-turbo", "input": "Hello there.", "response_format": "pcm"})
            host, port = server.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
                until(lambda: server.service.admission.in_flight == 1, what="the request's admission")
                assert pause.entered.wait(30)  # its chunk is in the held T3 step
            # the socket is closed: the request is cancelled while the engine is still held
            until(lambda: server.service.admission.in_flight == 0, what="the request's release")
            assert not pause.release.is_set()
        server.wait_idle()
        assert server.client.get("/metrics").status_code == 200  # the server carries on
