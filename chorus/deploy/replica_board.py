"""The replica board: a detached actor that every engine replica publishes its readiness and
Prometheus text to, and that the front reads for ``/ready`` and ``/metrics``."""
from __future__ import annotations

import time

import ray

PUBLISH_INTERVAL_S = 1.0  # replicas -> board
BOARD_STALE_S = 10.0  # a replica silent this long is gone (dead, or replaced)


@ray.remote(num_cpus=0)
class ReplicaBoard:
    """What each replica last published: {replica: (monotonic time, status dict, metrics text)}."""

    def __init__(self):
        self.entries: dict[str, tuple[float, dict, bytes]] = {}

    def publish(self, replica: str, status: dict, metrics: bytes) -> None:
        self.entries[replica] = (time.monotonic(), status, metrics)

    def read(self, stale_s: float = BOARD_STALE_S) -> dict[str, tuple[dict, bytes]]:
        now = time.monotonic()
        for replica in [r for r, (t, _, _) in self.entries.items() if now - t > stale_s]:
            del self.entries[replica]
        return {r: (status, metrics) for r, (_, status, metrics) in self.entries.items()}


def board(app_name: str):
    """The application's board (created on first use; detached, so it outlives any replica)."""
    return ReplicaBoard.options(name=f"chorus-board-{app_name}", namespace="chorus", get_if_exists=True,
                                lifetime="detached").remote()
