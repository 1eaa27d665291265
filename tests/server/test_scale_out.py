"""Scale-out on Ray Serve (chorus/deploy.py, docs/scaling.md): a local Ray cluster, two engine
replicas of the tiny random models behind the HTTP front. Requests spread over both, a voice
uploaded through one is spoken by the other, /metrics shows both and their totals, and a replica
killed with SIGKILL under load loses no request that had not started streaming while the
survivor keeps serving and Ray replaces the dead one."""
from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray")

from tests.conftest import DATA_DIR  # noqa: E402
from tests.server.live import TOKENS, server_config  # noqa: E402
from tests.server.ray_cluster import replicas, serve_cluster, wait_for  # noqa: E402

CLIP = Path(DATA_DIR) / "sample-01.mp3"
pytestmark = [pytest.mark.timeout(240), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

LONG_TOKENS = 48  # speech tokens per chunk of the replica-kill test's requests


@pytest.fixture(scope="module")
def cluster(module_tmp_path_factory):
    # a cap high enough for the long streams the replica-kill test needs; other requests ask for TOKENS
    config = server_config(module_tmp_path_factory.mktemp("voices"), max_upload_bytes=2 << 20, stall_timeout_s=30.0,
                           max_new_tokens=LONG_TOKENS)
    with serve_cluster(config, ready=2, replicas=2) as client:
        yield client


def speech(client: httpx.Client, **body) -> httpx.Response:
    body = {"model": "chatterbox-turbo", "input": "Hello there.", "response_format": "wav", "max_new_tokens": TOKENS,
            **body}
    return client.post("/v1/audio/speech", json=body)


def test_requests_spread_over_both_replicas(cluster):
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: speech(cluster, seed=i), range(8)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    served = {r.headers["X-Chorus-Replica"] for r in responses}
    assert served == set(replicas())
    errors = speech(cluster, model="nope")
    assert errors.status_code == 400 and errors.json()["error"]["code"] == "model_not_found"


def test_a_voice_uploaded_through_one_replica_speaks_on_the_other(cluster):
    files = {"file": ("clip.mp3", CLIP.read_bytes(), "application/octet-stream")}
    created = cluster.post("/v1/voices", files=files, data={"name": "shared"})
    assert created.status_code == 201, created.text
    voice = created.json()["id"]
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: speech(cluster, voice=voice, seed=i), range(8)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    assert len({r.headers["X-Chorus-Replica"] for r in responses}) == 2
    assert voice in [v["id"] for v in cluster.get("/v1/voices").json()["data"]]


def test_metrics_show_every_replica_and_the_total(cluster):
    speech(cluster)
    ids = set(replicas())
    text = ""

    def published() -> bool:  # each replica publishes its metrics once per interval
        nonlocal text
        text = cluster.get("/metrics").text
        return all(f'chorus_requests_total{{replica="{replica}",status="ok"}}' in text for replica in ids) \
            and 'chorus_requests_total{replica="total",status="ok"}' in text

    wait_for(published, 30, "every replica's metrics at the front")
    per = sum(float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("chorus_requests_total{replica=") and 'status="ok"' in line
              and 'replica="total"' not in line)
    total = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith('chorus_requests_total{replica="total",status="ok"}'))
    assert per == total >= 1
    assert 'chorus_time_to_first_audio_seconds_count{replica="total"}' in text
    assert 'chorus_front_replicas{ready="true"} 2.0' in text


def test_a_replica_killed_under_load_loses_no_request_that_had_not_started(cluster):
    victim, survivor = sorted(replicas().items())
    outcomes: list[tuple[str, object]] = []
    lock = threading.Lock()
    victim_streaming = threading.Event()

    def one(i: int) -> None:
        # four times the other tests' tokens per chunk, so a victim's stream is still flowing when it is killed
        body = {"model": "chatterbox-turbo", "input": "A longer text to speak. " * 12, "response_format": "pcm", "seed": i,
                "max_new_tokens": LONG_TOKENS}
        started = False
        try:
            with cluster.stream("POST", "/v1/audio/speech", json=body) as response:
                if response.status_code != 200:
                    outcome = ("error_before_audio", response.read().decode())
                else:
                    started = True
                    if response.headers["X-Chorus-Replica"] == victim[0]:
                        victim_streaming.set()
                    response.read()
                    outcome = ("ok", response.headers["X-Chorus-Replica"])
        except httpx.HTTPError as exc:
            outcome = ("cut_while_streaming" if started else "error_before_audio", repr(exc))
        with lock:
            outcomes.append(outcome)

    threads: list[threading.Thread] = []

    def launch() -> None:
        threads.append(threading.Thread(target=one, args=(len(threads),)))
        threads[-1].start()

    for _ in range(8):
        launch()
    deadline = time.monotonic() + 60
    while not victim_streaming.wait(0.5):  # the router may have sent a burst elsewhere: offer more
        assert time.monotonic() < deadline, "no request reached the victim"
        if len(threads) < 12:
            launch()
    os.kill(victim[1]["pid"], signal.SIGKILL)
    for _ in range(4):  # arrive while the front still believes in the dead replica
        launch()
    for t in threads:
        t.join(120)
    kinds = [kind for kind, _ in outcomes]
    assert len(outcomes) == len(threads)
    assert "error_before_audio" not in kinds, outcomes
    assert kinds.count("ok") >= 4 and kinds.count("cut_while_streaming") >= 1
    # the survivor keeps serving
    after = [speech(cluster, seed=100 + i) for i in range(3)]
    assert all(r.status_code == 200 for r in after), [r.text for r in after]
    # Ray replaces the dead replica; /ready stays 200 meanwhile
    assert cluster.get("/ready").status_code == 200
    wait_for(lambda: victim[0] not in replicas() and len([s for s in replicas().values() if s["ready"]]) == 2,
             150, "a replacement replica")
    assert survivor[0] in replicas()
    metrics = cluster.get("/metrics").text
    assert 'chorus_front_stream_cuts_total{reason="replica_lost"}' in metrics  # the cut is counted


def test_with_every_replica_down_a_request_is_answered_within_its_deadline(cluster):
    for status in replicas().values():
        os.kill(status["pid"], signal.SIGKILL)
    body = {"model": "chatterbox-turbo", "input": "Anyone there?", "response_format": "pcm", "deadline_s": 2,
            "max_new_tokens": TOKENS}
    started = time.monotonic()
    response = cluster.post("/v1/audio/speech", json=body)
    elapsed = time.monotonic() - started
    # Serve may bring a replacement up within the front's wait (tiny models start in seconds);
    # what must never happen is a request left waiting without an answer
    assert elapsed < 2 + 5 + 10  # the deadline, the front's grace, slack for a loaded machine
    assert response.status_code in (200, 503), response.status_code
    if response.status_code == 503:
        assert response.json()["error"]["code"] in ("replica_unavailable", "replica_lost")
        assert "Retry-After" in response.headers


def test_the_application_builder_takes_serve_run_arguments():
    from chorus.deploy import app

    built = app({"variant": "turbo", "max_queue": "64", "replicas": "2", "min_replicas": "1", "max_replicas": "3",
                 "target_ongoing_requests": "16", "gpus_per_replica": "0"})
    ingress = built._bound_deployment
    engine = ingress.init_args[1]._bound_deployment
    assert ingress.init_args[0].max_queue == 64
    scaling = engine._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.initial_replicas, scaling.max_replicas) == (1, 2, 3)
    assert scaling.target_ongoing_requests == 16.0
    fixed = app({"replicas": "2", "gpus_per_replica": "1"})._bound_deployment.init_args[1]._bound_deployment
    assert fixed._deployment_config.num_replicas == 2 and fixed._deployment_config.autoscaling_config is None
    assert fixed.ray_actor_options["num_gpus"] == 1.0


def test_merged_metrics_label_each_replica_and_sum_the_series():
    from chorus.deploy import merge_metrics

    def text(ok: int, le_1: int) -> bytes:
        return (f"# HELP chorus_requests Speech requests\n# TYPE chorus_requests counter\n"
                f'chorus_requests_total{{status="ok"}} {ok}.0\nchorus_requests_created{{status="ok"}} 17.0\n'
                f"# HELP chorus_ttfa TTFA\n# TYPE chorus_ttfa histogram\n"
                f'chorus_ttfa_bucket{{le="1.0"}} {le_1}.0\nchorus_ttfa_count {le_1}.0\n').encode()

    merged = merge_metrics({"a": text(2, 1), "b": text(3, 4)}).decode().splitlines()
    assert merged.count("# TYPE chorus_requests counter") == 1
    assert 'chorus_requests_total{replica="a",status="ok"} 2.0' in merged
    assert 'chorus_requests_total{replica="total",status="ok"} 5.0' in merged
    assert 'chorus_ttfa_bucket{replica="total",le="1.0"} 5.0' in merged
    assert 'chorus_ttfa_count{replica="total"} 5.0' in merged
    assert not any(line.startswith('chorus_requests_created{replica="total"') for line in merged)
