"""Several models in one server (docs/models.md), on a live server of tiny models: routing by
``model``, /v1/models, labelled metrics, A/B splits sticky per key, and the admin API's swap
(nothing lost or cut, /ready up throughout), failed loads and unloads."""
from __future__ import annotations

import concurrent.futures
import gc
import threading
import weakref
from pathlib import Path

import httpx
import pytest

from chorus.server.config import ServerConfig
from chorus.server.model_entries import ModelEntry
from tests.conftest import DATA_DIR
from tests.engine.tiny_models import tiny
from tests.server.live import EnginePause, LiveServer, metric, server_config, tiny_loader, until
from tests.server.ws_client import collect, configure, connect, send
from tests.voices.front_ends import tiny_front_end

pytestmark = pytest.mark.timeout(180)

ADMIN = "admin-key-0123456789"
TEXT = "Hello there, this is a test."
CLIP = Path(DATA_DIR) / "sample-01.mp3"
TWO_MODELS = (ModelEntry(id="chatterbox-turbo", variant="turbo"), ModelEntry(id="chatterbox", variant="original"))


def _loader(config: ServerConfig):
    """Tiny models; a version whose checkpoint is ``broken`` fails to load, as a missing one would."""
    tiny = tiny_loader(config)

    def load(version_config: ServerConfig):
        if version_config.checkpoint == "broken":
            raise FileNotFoundError("no checkpoint at broken")
        return tiny(version_config)

    return load


def _admin(server: LiveServer, method: str, path: str, **kwargs) -> httpx.Response:
    return server.client.request(method, path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120, **kwargs)


def _speak(server: LiveServer, model: str, **extra) -> httpx.Response:
    return server.client.post("/v1/audio/speech", json={"model": model, "input": TEXT, "response_format": "pcm",
                                                        "seed": 1, **extra.pop("body", {})}, **extra)


@pytest.fixture(scope="module")
def two(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"), models=TWO_MODELS)
    with LiveServer(config, _loader(config)) as server:
        yield server


def test_each_model_id_routes_to_its_own_model(two):
    turbo, original = _speak(two, "chatterbox-turbo"), _speak(two, "chatterbox")
    assert turbo.status_code == original.status_code == 200
    assert turbo.content != original.content  # two different models spoke
    assert _speak(two, "turbo").content == turbo.content  # the bare variant name is an alias


def test_an_unknown_model_is_a_400_naming_the_served_ones(two):
    answer = _speak(two, "chatterbox-nano")
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and "chatterbox-turbo" in error["message"] and "chatterbox" in error["message"]


@pytest.mark.parametrize("model, advice, wrong", [
    ("chatterbox", "steer delivery with exaggeration and cfg_weight", "[laugh]"),
    ("chatterbox-turbo", "turbo ignores exaggeration and cfg_weight; steer delivery with paralinguistic tags in "
                         "the input, such as [laugh] or [sigh]", "steer delivery with exaggeration"),
])
def test_the_instructions_error_advises_what_steers_that_model(two, model, advice, wrong):
    response = _speak(two, model, body={"instructions": "speak softly"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "instructions"
    assert error["message"].endswith(advice) and wrong not in error["message"], error["message"]


def test_models_lists_each_model_with_variant_languages_and_versions(two):
    cards = {c["id"]: c for c in two.client.get("/v1/models").json()["data"]}
    assert set(cards) == {"chatterbox-turbo", "chatterbox", "turbo"}  # the alias of chatterbox-<variant> ids
    assert cards["chatterbox"]["variant"] == "original" and cards["chatterbox"]["languages"] == []
    assert cards["chatterbox-turbo"]["versions"] == [{"version": "1", "weight": 100, "state": "ready"}]
    assert cards["turbo"]["alias_of"] == "chatterbox-turbo"
    assert two.client.get("/v1/models/chatterbox").json()["variant"] == "original"


def test_metrics_carry_the_model_and_version_labels(two):
    assert _speak(two, "chatterbox").status_code == 200
    text = two.client.get("/metrics").text
    assert metric(text, "chorus_requests_total", 'model="chatterbox",version="1",status="ok"') >= 1
    assert 'chorus_kv_blocks{model="chatterbox-turbo",state="used",version="1"}' in text
    assert text.count("# TYPE chorus_requests_total counter") == 1  # one family, a series per model
    assert "process_cpu_seconds_total " in text  # the process's own gauges once, unlabelled


def _ws_turn(ws, turn_id: str) -> None:
    send(ws, type="text", turn_id=turn_id, text=TEXT)
    send(ws, type="flush", turn_id=turn_id)
    turn = collect(ws, [turn_id])[turn_id]
    assert turn.of("done") and turn.audio, turn.events


def test_a_voice_agent_connection_speaks_with_the_model_it_configured(two):
    with connect(two) as ws:
        configure(ws, model="chatterbox")
        _ws_turn(ws, "t1")

    def turns(model: str) -> float:  # (a turn is counted once it has ended, just after its done event)
        return metric(two.client.get("/metrics").text, "chorus_ws_turns_total", f'model="{model}",outcome="done"')

    until(lambda: turns("chatterbox") == 1, what="the turn counted on chatterbox")
    assert turns("chatterbox-turbo") == 0


def test_an_uploaded_voice_speaks_with_every_model(tmp_path):
    config = server_config(tmp_path, models=TWO_MODELS)
    with LiveServer(config, tiny_loader(config, front_end=lambda variant: tiny_front_end(tiny(variant)[0]))) as server:
        created = server.client.post("/v1/voices", files={"file": ("clip.mp3", CLIP.read_bytes())})
        assert created.status_code == 201, created.text
        voice = created.json()["id"]
        for model in ("chatterbox-turbo", "chatterbox"):
            with_voice, builtin = _speak(server, model, body={"voice": voice}), _speak(server, model)
            assert with_voice.status_code == 200 and with_voice.content != builtin.content, model
    # one upload, one id: the clip kept once, a voice built for each model family on its first use
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(voice)) == [
        f"{voice}.clip", f"{voice}.json", f"{voice}.original.safetensors", f"{voice}.turbo.safetensors"]


def test_ready_names_the_model_whose_start_failed(tmp_path):
    models = (ModelEntry(id="good", variant="turbo"), ModelEntry(id="bad", variant="turbo", checkpoint="broken"))
    config = server_config(tmp_path, models=models)
    with LiveServer(config, _loader(config), wait_ready=False) as server:
        until(lambda: server.backend.state == "failed", what="start-up to end")
        ready = server.client.get("/ready")
        assert ready.status_code == 503 and ready.json()["reason"].startswith("model bad: version 1:")
        assert _speak(server, "good").status_code == 200  # the other model serves meanwhile
        assert _speak(server, "bad").json()["error"]["code"] == "not_ready"


# -- A/B ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ab(module_tmp_path_factory):
    models = (ModelEntry(id="chatterbox-turbo", variant="turbo", version="a", weight=50),
              ModelEntry(id="chatterbox-turbo", variant="turbo", version="b", weight=50))
    config = server_config(module_tmp_path_factory.mktemp("voices"), models=models, admin_keys=(ADMIN,))
    with LiveServer(config, _loader(config)) as server:
        yield server


def _version(server: LiveServer, key: str | None = None) -> str:
    headers = {"X-Chorus-Affinity": key} if key is not None else {}
    answer = _speak(server, "chatterbox-turbo", headers=headers, body={"max_new_tokens": 4})
    assert answer.status_code == 200
    return answer.headers["x-chorus-model-version"]


def test_an_ab_split_is_sticky_per_affinity_key(ab):
    for key in ("caller-1", "caller-2", "caller-3"):
        assert len({_version(ab, key) for _ in range(3)}) == 1


def test_an_ab_split_sends_keys_to_both_versions(ab):
    assert {_version(ab, f"caller-{i}") for i in range(16)} == {"a", "b"}  # 2^-15 to fail by chance


def test_weights_move_the_split(ab):
    moved = _admin(ab, "PUT", "/v1/admin/models/chatterbox-turbo/weights", json={"weights": {"a": 0}})
    assert moved.status_code == 200
    try:
        assert {_version(ab, f"caller-{i}") for i in range(6)} == {"b"}
        assert _admin(ab, "PUT", "/v1/admin/models/chatterbox-turbo/weights",
                      json={"weights": {"b": 0}}).json()["error"]["message"].endswith("so it would get no traffic")
    finally:
        _admin(ab, "PUT", "/v1/admin/models/chatterbox-turbo/weights", json={"weights": {"a": 50}})


# -- the admin API -----------------------------------------------------------------------------------

def test_the_admin_api_needs_an_admin_key(tmp_path, ab):
    assert ab.client.get("/v1/admin/models").status_code == 401  # no key
    api_keyed = ab.client.get("/v1/admin/models", headers={"Authorization": "Bearer not-the-admin-key"})
    assert api_keyed.status_code == 401 and api_keyed.json()["error"]["code"] == "invalid_admin_key"
    config = server_config(tmp_path)
    with LiveServer(config, _loader(config)) as server:  # no admin keys: no admin API
        assert _admin(server, "GET", "/v1/admin/models").status_code == 404


def test_a_failed_load_changes_nothing_and_says_why(ab):
    answer = _admin(ab, "POST", "/v1/admin/models/chatterbox-turbo/load",
                    json={"version": "c", "checkpoint": "broken"})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "load_failed" and "no checkpoint at broken" in error["message"]
    assert [v["version"] for v in ab.client.get("/v1/models/chatterbox-turbo").json()["versions"]] == ["a", "b"]
    assert ab.client.get("/ready").status_code == 200


def test_a_version_loaded_with_a_weight_joins_the_split_and_unloads_on_delete(ab):
    joined = _admin(ab, "POST", "/v1/admin/models/chatterbox-turbo/load", json={"version": "c", "weight": 100})
    assert joined.status_code == 200, joined.text
    assert [v["version"] for v in joined.json()["versions"]] == ["a", "b", "c"]
    assert "c" in {_version(ab, f"caller-{i}") for i in range(16)}  # 2^-16 to fail by chance (weight 100 of 200)
    left = _admin(ab, "DELETE", "/v1/admin/models/chatterbox-turbo/versions/c")
    assert left.status_code == 200 and {v["version"]: v["state"] for v in left.json()["versions"]}["c"] == "retiring"
    assert {_version(ab, f"caller-{i}") for i in range(8)} <= {"a", "b"}
    until(lambda: _versions(ab) == ["a", "b"], what="version c to unload")


def test_a_version_label_cannot_be_loaded_twice(ab):
    answer = _admin(ab, "POST", "/v1/admin/models/chatterbox-turbo/load", json={"version": "a"})
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "version_exists"


def test_an_unknown_version_is_a_404(ab):
    answer = _admin(ab, "DELETE", "/v1/admin/models/chatterbox-turbo/versions/zz")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "version_not_found"
    answer = _admin(ab, "PUT", "/v1/admin/models/chatterbox-turbo/weights", json={"weights": {"zz": 1}})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "version_not_found"


def test_the_last_version_cannot_be_unloaded(tmp_path):
    config = server_config(tmp_path, admin_keys=(ADMIN,))
    with LiveServer(config, _loader(config)) as server:
        answer = _admin(server, "DELETE", "/v1/admin/models/chatterbox-turbo/versions/1")
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "last_version"


def _versions(server: LiveServer) -> list[str]:
    return [r["version"] for r in _admin(server, "GET", "/v1/admin/models").json()["data"]]


def test_a_swap_under_steady_traffic_loses_and_cuts_nothing(tmp_path):
    config = server_config(tmp_path, admin_keys=(ADMIN,), max_new_tokens=40)
    with LiveServer(config, _loader(config)) as server, concurrent.futures.ThreadPoolExecutor(5) as pool:
        old = weakref.ref(server.service.pipeline)
        stop, outcomes, ready = threading.Event(), [], []

        def client() -> None:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                while not stop.is_set():
                    try:
                        with http.stream("POST", "/v1/audio/speech", json={
                                "model": "chatterbox-turbo", "input": TEXT, "response_format": "pcm",
                                "seed": 3}) as answer:
                            body = answer.read()
                        outcomes.append((answer.status_code, answer.headers.get("x-chorus-model-version"), len(body)))
                    except httpx.HTTPError as exc:  # a cut stream or a refused connection
                        outcomes.append((type(exc).__name__, None, 0))

        def probe() -> None:  # ten times a second: in a tight loop it would take the server's GIL
            with httpx.Client(base_url=server.url, timeout=60) as http:
                while not stop.wait(0.1):
                    ready.append(http.get("/ready").status_code)

        workers = [pool.submit(client) for _ in range(4)] + [pool.submit(probe)]
        until(lambda: len(outcomes) >= 4, what="traffic on the first version")
        swapped = _admin(server, "POST", "/v1/admin/models/chatterbox-turbo/load", json={"version": "2"})
        assert swapped.status_code == 200, swapped.text
        until(lambda: sum(v == "2" for _, v, _ in outcomes) >= 4, what="traffic on the new version")
        until(lambda: _versions(server) == ["2"], what="the old version to unload")
        stop.set()
        for worker in workers:
            worker.result()
        gc.collect()
        assert old() is None  # the old pipeline (its models, KV pool and vocoder) is gone: its memory returned
    assert all(status == 200 for status, _, _ in outcomes), [o for o in outcomes if o[0] != 200]
    assert {v for _, v, _ in outcomes} == {"1", "2"}
    assert len({n for _, _, n in outcomes}) == 1  # every response whole (same seed, same weights)
    assert set(ready) == {200}


def test_a_swap_lets_a_stream_of_the_old_version_finish(tmp_path):
    config = server_config(tmp_path, admin_keys=(ADMIN,), max_new_tokens=300, canary_interval_s=3600.0)
    with LiveServer(config, _loader(config)) as server:
        whole = _speak(server, "chatterbox-turbo").content
        # the old version's T3 runs 30 tokens (past the 20 of the first audio), then is held
        # mid-stream across the swap
        with EnginePause(server, after_tokens=30) as pause, server.client.stream("POST", "/v1/audio/speech", json={
                "model": "chatterbox-turbo", "input": TEXT, "response_format": "pcm", "seed": 1}) as held:
            chunks = held.iter_raw()
            body = next(chunks)
            assert pause.entered.wait(30)
            assert _admin(server, "POST", "/v1/admin/models/chatterbox-turbo/load",
                          json={"version": "2"}).status_code == 200
            rows = {r["version"]: r for r in _admin(server, "GET", "/v1/admin/models").json()["data"]}
            assert rows["1"]["state"] == "retiring" and rows["1"]["in_flight"] == 1
            assert _speak(server, "chatterbox-turbo").headers["x-chorus-model-version"] == "2"
            pause.release.set()
            body += b"".join(chunks)  # raises if the stream was cut
        assert held.headers["x-chorus-model-version"] == "1" and body == whole
        assert len(whole) > 30 * 960 * 2  # it ran past the pause (30 tokens of 16-bit audio)
        until(lambda: _versions(server) == ["2"], what="the old version to unload once its stream ended")


def test_a_voice_agent_turn_after_a_swap_runs_on_the_new_version(tmp_path):
    config = server_config(tmp_path, admin_keys=(ADMIN,))
    with LiveServer(config, _loader(config)) as server, connect(server) as ws:
        configure(ws)
        _ws_turn(ws, "before")
        assert _admin(server, "POST", "/v1/admin/models/chatterbox-turbo/load", json={"version": "2"}).status_code == 200
        _ws_turn(ws, "after")  # the same connection: the next turn goes where the route points now

        def turns_on_2() -> float:  # (a turn is counted once it has ended, just after its done event)
            return metric(server.client.get("/metrics").text, "chorus_ws_turns_total", 'version="2",outcome="done"')

        until(lambda: turns_on_2() == 1, what="the turn counted on version 2")
        until(lambda: _versions(server) == ["2"], what="the old version to unload")
