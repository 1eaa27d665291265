"""Scale-out on Ray Serve (chorus/deploy/, docs/scaling.md): a local Ray cluster, two engine
replicas of the tiny random models behind the HTTP front. Requests spread over both, a voice
uploaded through one is spoken by the other, /metrics shows both and their totals, and a replica
killed with SIGKILL under load loses no request that had not started streaming while the
survivor keeps serving and Ray replaces the dead one. Then the same cluster serves two models,
one deployment each. The cluster's driver and the requests run in a child process (ray_child.py).
Without a cluster: the deployment graph of one and of several models, the front's routing, cards
and A/B weights, and the metrics merge."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from chorus.server.errors import APIError
from chorus.server.model_entries import ModelEntry

from tests.conftest import DATA_DIR
from tests.server.live import TOKENS, server_config
from tests.server.ray_child import Child
from tests.server.ray_cluster import deploy, replicas, serve_cluster, wait_for

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed (pip install 'chorus[ray]')", allow_module_level=True)

CLIP = Path(DATA_DIR) / "sample-01.mp3"
# the child's own limits (starting the cluster, the longest scenario, leaving it) fail first; this one is a backstop
pytestmark = [pytest.mark.timeout(240 + 480 + 120 + 60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

LONG_TOKENS = 48  # speech tokens per chunk of the replica-kill test's requests
ONE = 'model="chatterbox-turbo",version="1"'  # the labels of the one model's replicas' samples


@pytest.fixture(scope="module")
def driver(module_tmp_path_factory):
    """The Ray driver's child process, holding the cluster open; its scenarios get the cluster's
    HTTP client."""
    # a cap high enough for the long streams the replica-kill test needs; other requests ask for TOKENS.
    # Admission by the bounded queue only, and a start deadline past the tests' own timeout: on a
    # loaded 2-core machine the survivor of the replica-kill test predicts a first audio beyond the
    # CPU's 60 s, and a 429 or 504 from it would hide whether the front lost a request (admission
    # under load has its own tests, in tests/server/test_overload.py and test_admission.py)
    config = server_config(module_tmp_path_factory.mktemp("voices"), max_upload_bytes=2 << 20, stall_timeout_s=30.0,
                           max_new_tokens=LONG_TOKENS, admission="queue", start_deadline_s=600.0)
    with Child(serve_cluster, config, ready=2, replicas=2, timeout_s=240) as child:
        yield child


def speech(client: httpx.Client, **body) -> httpx.Response:
    body = {"model": "chatterbox-turbo", "input": "Hello there.", "response_format": "wav", "max_new_tokens": TOKENS,
            **body}
    return client.post("/v1/audio/speech", json=body)


def test_requests_spread_over_both_replicas(driver):
    driver.run(requests_spread_over_both_replicas, timeout_s=180)


def requests_spread_over_both_replicas(cluster: httpx.Client) -> None:
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: speech(cluster, seed=i), range(8)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    served = {r.headers["X-Chorus-Replica"] for r in responses}
    assert served == set(replicas())
    errors = speech(cluster, model="nope")
    assert errors.status_code == 400 and errors.json()["error"]["code"] == "model_not_found"


def test_a_voice_uploaded_through_one_replica_speaks_on_the_other(driver):
    driver.run(a_voice_uploaded_through_one_replica_speaks_on_the_other, timeout_s=240)


def a_voice_uploaded_through_one_replica_speaks_on_the_other(cluster: httpx.Client) -> None:
    files = {"file": ("clip.mp3", CLIP.read_bytes(), "application/octet-stream")}
    created = cluster.post("/v1/voices", files=files, data={"name": "shared"})
    assert created.status_code == 201, created.text
    voice = created.json()["id"]
    # Serve routes each request to the replica with the shorter queue, so on a loaded machine a
    # wave of 8 went all to one (seen once in CI); send waves until both have spoken the voice
    served: set[str] = set()
    with ThreadPoolExecutor(8) as pool:
        for wave in range(6):
            responses = list(pool.map(lambda i: speech(cluster, voice=voice, seed=i), range(8 * wave, 8 * wave + 8)))
            assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
            served |= {r.headers["X-Chorus-Replica"] for r in responses}
            if len(served) == 2:
                break
    assert len(served) == 2
    assert voice in [v["id"] for v in cluster.get("/v1/voices").json()["data"]]


def test_metrics_show_every_replica_and_the_total(driver):
    driver.run(metrics_show_every_replica_and_the_total, timeout_s=120)


def metrics_show_every_replica_and_the_total(cluster: httpx.Client) -> None:
    speech(cluster)
    ids = set(replicas())
    text = ""

    def published() -> bool:  # each replica publishes its metrics once per interval
        nonlocal text
        text = cluster.get("/metrics").text
        return all(f'chorus_requests_total{{replica="{replica}",{ONE},status="ok"}}' in text for replica in ids) \
            and f'chorus_requests_total{{replica="total",{ONE},status="ok"}}' in text

    wait_for(published, 30, "every replica's metrics at the front")
    per = sum(float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("chorus_requests_total{replica=") and 'status="ok"' in line
              and 'replica="total"' not in line)
    total = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith(f'chorus_requests_total{{replica="total",{ONE},status="ok"}}'))
    assert per == total >= 1
    assert f'chorus_time_to_first_audio_seconds_count{{replica="total",{ONE}}}' in text
    assert 'chorus_front_replicas{ready="true"} 2.0' in text


def test_a_replica_killed_under_load_loses_no_request_that_had_not_started(driver):
    driver.run(a_replica_killed_under_load_loses_no_request_that_had_not_started, timeout_s=480)


def a_replica_killed_under_load_loses_no_request_that_had_not_started(cluster: httpx.Client) -> None:
    victim, survivor = sorted(replicas().items())
    outcomes: list[tuple[str, object]] = []
    lock = threading.Lock()
    victim_streaming = threading.Event()

    def one(i: int) -> None:
        # four times the other tests' tokens per chunk, so a victim's stream is still flowing when it is killed
        body = {"model": "chatterbox-turbo", "input": "A longer text to speak. " * 6, "response_format": "pcm", "seed": i,
                "max_new_tokens": LONG_TOKENS}
        started = False
        try:
            # the survivor carries up to 16 of these alone: on a loaded machine a first byte can
            # take longer than the client's default 60 s, which is slowness, not a lost request
            with cluster.stream("POST", "/v1/audio/speech", json=body, timeout=150.0) as response:
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
        t.join(160)
    kinds = [kind for kind, _ in outcomes]
    assert len(outcomes) == len(threads)
    assert "error_before_audio" not in kinds, [o for o in outcomes if o[0] == "error_before_audio"]
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


def test_with_every_replica_down_a_request_is_answered_within_its_deadline(driver):
    driver.run(with_every_replica_down_a_request_is_answered_within_its_deadline, timeout_s=120)


def with_every_replica_down_a_request_is_answered_within_its_deadline(cluster: httpx.Client) -> None:
    for status in replicas().values():
        with contextlib.suppress(ProcessLookupError):  # (one the last test killed may still be listed)
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


TWO_MODELS = (ModelEntry(id="chatterbox-turbo", variant="turbo", version="t1"),
              ModelEntry(id="chatterbox", variant="original", version="o2"))


def test_two_models_serve_from_their_own_deployments(driver, module_tmp_path_factory):
    # the last test on the cluster: it replaces the one-model application with a two-model one
    config = server_config(module_tmp_path_factory.mktemp("two"), models=TWO_MODELS, max_new_tokens=TOKENS)
    driver.run(two_models_serve_from_their_own_deployments, config, timeout_s=360)


def two_models_serve_from_their_own_deployments(cluster: httpx.Client, config) -> None:
    deploy(config, replicas=1)
    names = {"chatterbox-turbo@t1", "chatterbox@o2"}
    wait_for(lambda: {s.get("deployment") for s in replicas().values() if s["ready"]} >= names, 150,
             "a ready replica of each model's deployment")
    wait_for(lambda: cluster.get("/ready").status_code == 200 and len(cluster.get("/v1/models").json()["data"]) == 3,
             60, "the two-model front")
    for model, model_id, version in (("chatterbox-turbo", "chatterbox-turbo", "t1"), ("chatterbox", "chatterbox", "o2"),
                                     ("turbo", "chatterbox-turbo", "t1")):
        answer = speech(cluster, model=model)
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Chorus-Model-Version"] == version and len(answer.content) > 44  # audio past the header
        assert replicas()[answer.headers["X-Chorus-Replica"]]["model"] == model_id  # from that model's deployment
    cards = {c["id"]: c for c in cluster.get("/v1/models").json()["data"]}
    assert cards["chatterbox"]["versions"] == [{"version": "o2", "weight": 100, "state": "ready"}]
    assert cards["turbo"]["alias_of"] == "chatterbox-turbo"
    assert speech(cluster, model="chatterbox-nano").json()["error"]["code"] == "model_not_found"
    admin = cluster.get("/v1/admin/models")
    assert admin.status_code == 501 and admin.json()["error"]["code"] == "not_supported"
    wait_for(lambda: 'chorus_requests_total{replica="total",model="chatterbox",version="o2",status="ok"}'
             in cluster.get("/metrics").text, 30, "the metrics of each model version")


def _two_model_app(**args):
    from chorus.deploy import app

    models = [{"id": "chatterbox-turbo", "variant": "turbo", "replicas": 3},
              {"id": "chatterbox-turbo", "variant": "turbo", "version": "ft1", "weight": 10, "min_replicas": 1,
               "max_replicas": 4},
              {"id": "chatterbox", "variant": "original", "checkpoint": "ckpt/original"}]
    return app({"models": models, "gpus_per_replica": "0", **args})._bound_deployment


def test_the_application_builder_takes_serve_run_arguments():
    from chorus.deploy import app

    built = app({"variant": "turbo", "max_queue": "64", "replicas": "2", "min_replicas": "1", "max_replicas": "3",
                 "target_ongoing_requests": "16", "gpus_per_replica": "0"})
    ingress = built._bound_deployment
    engine = ingress.init_args[1]["EngineReplica"]._bound_deployment  # one model: the one engine deployment
    assert ingress.init_args[0].max_queue == 64 and engine.name == "EngineReplica"
    scaling = engine._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.initial_replicas, scaling.max_replicas) == (1, 2, 3)
    assert scaling.target_ongoing_requests == 16.0
    fixed = app({"replicas": "2", "gpus_per_replica": "1"})._bound_deployment.init_args[1]["EngineReplica"]
    fixed = fixed._bound_deployment
    assert fixed._deployment_config.num_replicas == 2 and fixed._deployment_config.autoscaling_config is None
    assert fixed.ray_actor_options["num_gpus"] == 1.0


def test_each_model_version_is_its_own_deployment_with_its_own_scale():
    ingress = _two_model_app(replicas="2", target_ongoing_requests="8")
    engines = {name: bound._bound_deployment for name, bound in ingress.init_args[1].items()}
    assert list(engines) == ["chatterbox-turbo@1", "chatterbox-turbo@ft1", "chatterbox@1"]
    assert all(engine.name == name for name, engine in engines.items())
    turbo, ft1, original = (engines[n]._deployment_config for n in engines)
    assert turbo.num_replicas == 3 and turbo.autoscaling_config is None  # the entry's own count
    assert (ft1.autoscaling_config.min_replicas, ft1.autoscaling_config.initial_replicas,
            ft1.autoscaling_config.max_replicas) == (1, 2, 4)  # the entry's bounds, the app's count to start
    assert ft1.autoscaling_config.target_ongoing_requests == 8.0
    assert original.num_replicas == 2 and original.autoscaling_config is None  # the application's
    # each replica serves its version alone; the front knows them all
    version_config = engines["chatterbox@1"].init_args[0]
    assert (version_config.model_id, version_config.variant, version_config.checkpoint) == (
        "chatterbox", "original", "ckpt/original")
    assert [e.key for e in ingress.init_args[0].entries()] == [
        ("chatterbox-turbo", "1"), ("chatterbox-turbo", "ft1"), ("chatterbox", "1")]


def test_app_level_autoscaling_applies_to_entries_without_their_own():
    engines = _two_model_app(min_replicas="1", max_replicas="5").init_args[1]
    original = engines["chatterbox@1"]._bound_deployment._deployment_config
    assert (original.autoscaling_config.min_replicas, original.autoscaling_config.max_replicas) == (1, 5)
    turbo = engines["chatterbox-turbo@1"]._bound_deployment._deployment_config
    assert (turbo.autoscaling_config.initial_replicas, turbo.autoscaling_config.max_replicas) == (3, 5)


# -- the front's routing, without a cluster: handles are never called here, so plain markers stand in

def _front(models: str, statuses: dict[str, dict] | None = None):
    from chorus.deploy import RemoteBackend, deployment_name
    from chorus.server.config import build_config

    config = build_config(env={}, flags={"models": models})
    engines = {deployment_name(config, e): f"handle of {deployment_name(config, e)}" for e in config.entries()}
    backend = RemoteBackend(config, engines, "test")
    backend.replicas = {f"r-{name}": ({"ready": True, "reason": None, "state": "ready", "degradation_level": 0,
                                       "deployment": name, **(statuses or {}).get(name, {})}, b"")
                        for name in engines}
    return backend


AB = "id=chatterbox-turbo,variant=turbo,version=a,weight=90;id=chatterbox-turbo,variant=turbo,version=b,weight=10;" \
     "id=chatterbox,variant=original"


def test_the_front_routes_by_model_and_splits_like_one_process():
    from chorus.server.registry import Route, Version

    front = _front(AB)
    assert front.pick("chatterbox", "k").handle == "handle of chatterbox@1"
    assert front.pick("turbo", "k").entry.id == "chatterbox-turbo"  # the alias
    # the same key lands on the same version as in one process (one rule, model_entries.pick_version)
    local = Route("chatterbox-turbo", tuple(Version(d.entry, SimpleNamespace(state="ready"))
                                            for d in front.routes["chatterbox-turbo"]))
    keys = [f"caller-{i}" for i in range(400)]
    assert [front.pick("chatterbox-turbo", k).entry.version for k in keys] == [local.pick(k).label for k in keys]
    assert {front.pick("chatterbox-turbo", k).entry.version for k in keys} == {"a", "b"}
    with pytest.raises(APIError) as unknown:
        front.pick("chatterbox-nano", "k")
    assert unknown.value.status == 400 and unknown.value.code == "model_not_found"
    assert "chatterbox-turbo, chatterbox, turbo" in unknown.value.message


def test_the_front_passes_over_a_version_without_a_ready_replica():
    front = _front(AB, {"chatterbox-turbo@a": {"ready": False, "state": "loading", "reason": "loading"}})
    assert {front.pick("chatterbox-turbo", f"k{i}").entry.version for i in range(40)} == {"b"}
    assert front.readiness() == (True, None)  # every model has a ready replica


def test_the_front_is_not_ready_while_a_model_has_no_ready_replica():
    front = _front(AB)
    del front.replicas["r-chatterbox@1"]
    assert front.readiness() == (False, "model chatterbox: no engine replica is up yet")
    with pytest.raises(APIError) as refused:
        front.pick("chatterbox", "k")
    assert refused.value.status == 503 and refused.value.code == "not_ready"
    front.require_serving()  # the other model serves (and the voices with it)
    assert front.pick("chatterbox-turbo", "k").entry.id == "chatterbox-turbo"


def test_the_front_lists_every_model_with_its_versions_and_aliases():
    front = _front(AB, {"chatterbox-turbo@b": {"ready": False, "state": "failed", "reason": "canary"}})
    cards = {c["id"]: c for c in front.model_cards()}
    assert set(cards) == {"chatterbox-turbo", "chatterbox", "turbo"}
    assert cards["chatterbox-turbo"]["versions"] == [{"version": "a", "weight": 90, "state": "ready"},
                                                     {"version": "b", "weight": 10, "state": "failed"}]
    assert cards["turbo"]["alias_of"] == "chatterbox-turbo" and cards["chatterbox"]["variant"] == "original"
    assert front.model_ids() == ["chatterbox-turbo", "chatterbox", "turbo"]


def test_the_ingress_user_config_sets_the_weights_and_a_bad_one_changes_nothing(caplog):
    from chorus.deploy import Ingress

    front = _front(AB)
    reconfigure = Ingress.func_or_class.reconfigure
    ingress = SimpleNamespace(backend=front)

    def weights() -> dict[str, int]:
        return {d.entry.version: d.entry.weight for d in front.routes["chatterbox-turbo"]}

    reconfigure(ingress, {"weights": {"chatterbox-turbo": {"a": 0, "b": 100}}})
    assert weights() == {"a": 0, "b": 100}
    assert {front.pick("chatterbox-turbo", f"k{i}").entry.version for i in range(20)} == {"b"}
    for bad in ({"weights": {"chatterbox-turbo": {"c": 5}}}, {"weights": {"nope": {"1": 5}}},
                {"weights": {"chatterbox-turbo": {"a": -1}}}, {"weights": {"chatterbox-turbo": {"a": 0, "b": 0}}},
                {"colour": "red"}):
        reconfigure(ingress, bad)
        assert weights() == {"a": 0, "b": 100}, bad
    assert "has no version 'c'" in caplog.text and "'nope' is not served here" in caplog.text
    assert "every version of 'chatterbox-turbo' has weight 0" in caplog.text
    reconfigure(ingress, {"weights": {}})  # versions not named: their entries' weights
    assert weights() == {"a": 90, "b": 10}


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
    # replicas of several model versions: each labelled with its own, a total per model version
    labels = {"a": {"model": "m", "version": "1"}, "b": {"model": "m", "version": "2"}, "c": {"model": "m", "version": "2"}}
    merged = merge_metrics({"a": text(2, 1), "b": text(3, 4), "c": text(1, 1)}, labels).decode().splitlines()
    assert 'chorus_requests_total{replica="a",model="m",version="1",status="ok"} 2.0' in merged
    assert 'chorus_requests_total{replica="total",model="m",version="1",status="ok"} 2.0' in merged
    assert 'chorus_requests_total{replica="total",model="m",version="2",status="ok"} 4.0' in merged
    assert 'chorus_ttfa_count{replica="total",model="m",version="2"} 5.0' in merged
