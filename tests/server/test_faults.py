"""Faults injected into a live server (chorus/faults.py): a failed or poisoned T3 step or vocoder
pass costs only the requests in it (500 ``synthesis_failed``), never audio made of NaN; the
server recovers by itself (/ready stays 200, the next request succeeds) and every KV block
comes back. Faults are installed after start-up, so the start-up canary never meets them; the
``@N`` rules count from installation, so each test knows which step or pass fails."""
from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from chorus.faults import Faults
from tests.server.live import EnginePause, LiveServer, metric, server_config, tiny_loader
from tests.server.test_admission import _in_flight, _post

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def live(tmp_path):
    config = server_config(tmp_path)
    with LiveServer(config, tiny_loader(config)) as server:
        yield server


def _install(server: LiveServer, spec: str, seed: int = 0) -> Faults:
    faults = Faults.parse(spec, seed)
    server.pipeline.engine.runner.faults = faults
    server.pipeline.vocoder.faults = faults
    return faults


def _recovered(server: LiveServer) -> None:
    """The server healed by itself: nothing in use, ready, and a clean request succeeds."""
    server.wait_idle()
    assert server.pipeline.engine_stats().kv.num_used_blocks == 0
    assert server.client.get("/ready").status_code == 200
    server.pipeline.engine.runner.faults = server.pipeline.vocoder.faults = None
    assert server.speech(input="Hello again.", response_format="pcm").status_code == 200


def _failed(response: httpx.Response, words: str) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "synthesis_failed" and words in error["message"], error


def _held_pair(server: LiveServer, spec: str):
    """A in the T3 step that is held, B admitted behind it; ``spec`` installed before the
    step runs, so ``t3_step ... @1`` is A's first step and never B's."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with EnginePause(server) as pause:
            a = pool.submit(_post, server.url, input="Hello there.", response_format="pcm", seed=1)
            assert pause.entered.wait(30)
            _install(server, spec)
            b = pool.submit(_post, server.url, input="Hello there.", response_format="pcm", seed=2)
            _in_flight(server, 2)
        return a.result(), b.result()


@pytest.mark.parametrize("mode, words", [("raise", "InjectedFault"), ("oom", "OutOfMemoryError")])
def test_a_failed_t3_step_fails_its_requests_only(live, mode, words):
    a, b = _held_pair(live, f"t3_step:{mode}:@1")
    _failed(a, words)
    assert b.status_code == 200 and b.content  # in flight, not in the failed step: not lost
    assert metric(live.client.get("/metrics").text, "chorus_requests_total", 'status="synthesis_failed"') == 1
    _recovered(live)


def test_nan_logits_fail_their_request_and_are_never_sampled(live):
    a, b = _held_pair(live, "t3_step:nan:@1")
    _failed(a, "NaN logits")
    assert b.status_code == 200 and b.content
    _recovered(live)


@pytest.mark.parametrize("mode, words", [("raise", "InjectedFault"), ("oom", "OutOfMemoryError")])
def test_a_failed_vocoder_pass_fails_its_request_and_the_server_recovers(live, mode, words):
    _install(live, f"vocoder_pass:{mode}:@1")
    _failed(live.speech(input="Hello there.", response_format="pcm"), words)
    _recovered(live)


def test_nan_audio_fails_only_its_own_request(live):
    faults = _install(live, "vocoder_pass:nan:@1")  # poisons one job's piece of the first pass
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda seed: _post(live.url, input="Hello there.", response_format="pcm", seed=seed),
                                (1, 2)))
    assert sorted(a.status_code for a in answers) == [200, 500]
    _failed(next(a for a in answers if a.status_code == 500), "non-finite")
    assert faults.fired[("vocoder_pass", "nan")] == 1
    _recovered(live)


def test_random_faults_under_load_cost_only_their_requests(live):
    """Seeded faults of every kind at both sites while 16 requests run: each one ends as audio
    or as a 500 (none hangs or gets another error), and the server heals."""
    faults = _install(live, "t3_step:raise:0.03,t3_step:nan:0.03,t3_step:oom:0.03,"
                            "vocoder_pass:raise:0.1,vocoder_pass:nan:0.1,vocoder_pass:oom:0.1", seed=11)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda seed: _post(live.url, input="Hello there. How are you?",
                                                   response_format="pcm", seed=seed), range(16)))
    assert {a.status_code for a in answers} <= {200, 500}
    for answer in answers:
        if answer.status_code == 500:
            assert answer.json()["error"]["code"] == "synthesis_failed"
        else:
            assert answer.content
    assert sum(faults.fired.values()) > 0 and any(a.status_code == 500 for a in answers)
    _recovered(live)
