"""Helpers of the Ray Serve tests (test_scale_out.py, test_autoscaling.py): the replicas' loader,
a local cluster with the application deployed, and reading the replica board. Everything but the
loader runs in the Ray driver's child process (ray_child.py); Ray is imported there only, inside
the functions, so that pytest's process, which imports this module, never loads it."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time

import httpx

APP = "chorus"
LOADER = "tests.server.ray_cluster:load_tiny"
PROXY_TIMEOUTS = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60"}


def load_tiny(config):
    """The replicas' loader (imported by name on each replica): the tiny models of the replica's
    variant with a tiny voice front end, so uploads work."""
    from tests.engine.tiny_models import tiny
    from tests.server.live import tiny_loader
    from tests.voices.front_ends import tiny_front_end

    return tiny_loader(config, front_end=tiny_front_end(tiny(config.variant)[0]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replicas() -> dict[str, dict]:
    """Replica id -> its last published status (ready, state, pid, deployment, model, version, ...)."""
    import ray

    from chorus.deploy import board

    return {r: status for r, (status, _) in ray.get(board(APP).read.remote()).items()}


def ready_replicas() -> int:
    return sum(1 for status in replicas().values() if status["ready"])


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def deploy(config, **scale) -> None:
    """Run (or replace) the application built from ``config`` and ``scale`` (``build``'s keyword
    arguments) on the tiny models; returns without waiting for its replicas."""
    from ray import serve

    from chorus.deploy import build

    serve.run(build(config, gpus_per_replica=0, loader=LOADER, **scale), name=APP, route_prefix="/", blocking=False)


@contextlib.contextmanager
def serve_cluster(config, *, ready: int, **scale):
    """A local Ray cluster running the application built from ``config`` and ``scale``
    (``build``'s keyword arguments); yields an httpx client once ``ready`` replicas are."""
    import ray
    from ray import serve

    # Serve's proxy must answer its ready check within 5 s and its health check within 10 s, or
    # Serve kills it: a loaded 2-core machine misses that, and every request through the proxy
    # fails. The tests kill replicas, never the proxy: give it a minute (the cluster's processes
    # inherit the environment at ray.init; this process is the cluster's driver and nothing else)
    os.environ.update(PROXY_TIMEOUTS)
    ray.init(num_cpus=3, object_store_memory=128 << 20, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy(config, **scale)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0)
        wait_for(lambda: ready_replicas() == ready, 150, f"{ready} ready replica(s)")
        wait_for(lambda: client.get("/ready").status_code == 200, 30, "/ready")
        yield client
        client.close()
    finally:
        serve.shutdown()
        ray.shutdown()
        # the cluster's session folder (logs, sockets) stays after shutdown; it is the run's temp
        # dir's "ray" (TMPDIR, tests/run_temp_dir.py), which Ray makes
        shutil.rmtree(os.path.join(tempfile.gettempdir(), "ray"), ignore_errors=True)
