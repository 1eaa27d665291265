"""Autoscaling on Ray Serve, live (chorus/deploy/application.py ``build``, docs/scaling.md "Autoscaling"):
one tiny engine replica, a burst of concurrent requests adds a second replica, every request is
answered, and the application goes back to one replica once the burst is over."""
from __future__ import annotations

import threading

import httpx
import pytest

ray = pytest.importorskip("ray")

from tests.server.live import server_config  # noqa: E402
from tests.server.ray_cluster import ready_replicas, serve_cluster, wait_for  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def test_a_burst_adds_a_replica_and_its_end_removes_it(tmp_path):
    config = server_config(tmp_path / "voices", stall_timeout_s=30.0)
    with serve_cluster(config, ready=1, min_replicas=1, max_replicas=2, target_ongoing_requests=1,
                       upscale_delay_s=1, downscale_delay_s=3, look_back_period_s=2) as client:
        statuses: list[int] = []
        stop = threading.Event()

        def client_loop(i: int) -> None:
            body = {"model": "chatterbox-turbo", "input": "A longer text to speak. " * 6,
                    "response_format": "pcm", "seed": i}
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
