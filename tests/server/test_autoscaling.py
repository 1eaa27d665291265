"""Autoscaling on Ray Serve, live (chorus/deploy/application.py ``build``, docs/scaling.md "Autoscaling"):
one tiny engine replica, a burst of concurrent requests adds a second replica, every request is
answered, and the application goes back to one replica once the burst is over. The cluster's
driver and the requests run in a child process (ray_child.py)."""
from __future__ import annotations

import importlib.util
import threading

import httpx
import pytest

from tests.server.live import server_config
from tests.server.ray_child import Child
from tests.server.ray_cluster import ready_replicas, serve_cluster, wait_for

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed (pip install 'chorus[ray]')", allow_module_level=True)

# the child's own limits (starting the cluster, the scenario, leaving it) fail first; this one is a backstop
pytestmark = pytest.mark.timeout(240 + 360 + 120 + 60)


def test_a_burst_adds_a_replica_and_its_end_removes_it(tmp_path):
    config = server_config(tmp_path / "voices", stall_timeout_s=30.0)
    with Child(serve_cluster, config, ready=1, min_replicas=1, max_replicas=2, target_ongoing_requests=1,
               upscale_delay_s=1, downscale_delay_s=3, look_back_period_s=2, timeout_s=240) as cluster:
        cluster.run(a_burst_adds_a_replica_and_its_end_removes_it, timeout_s=360)


def a_burst_adds_a_replica_and_its_end_removes_it(client: httpx.Client) -> None:
    statuses: list[int] = []
    stop = threading.Event()

    def client_loop(i: int) -> None:
        body = {"model": "chatterbox-turbo", "input": "A longer text to speak. " * 6, "response_format": "pcm", "seed": i}
        with httpx.Client(base_url=client.base_url, timeout=120.0) as own:
            while not stop.is_set():
                statuses.append(own.post("/v1/audio/speech", json=body).status_code)

    burst = [threading.Thread(target=client_loop, args=(i,)) for i in range(6)]
    for thread in burst:
        thread.start()
    try:
        wait_for(lambda: ready_replicas() == 2, 150, "a second replica under the burst")
    finally:
        stop.set()
        for thread in burst:
            thread.join(150)
    assert statuses and set(statuses) == {200}, statuses
    wait_for(lambda: ready_replicas() == 1, 150, "back to one replica after the burst")
    assert client.post("/v1/audio/speech", json={"model": "chatterbox-turbo", "input": "Still here.",
                                                 "response_format": "pcm"}).status_code == 200
