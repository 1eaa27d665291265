"""The request router of the engine deployments: the least loaded replica first (queue fill plus
KV use, from each replica's routing stats), not round robin."""
from __future__ import annotations

import random

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica


class LeastLoadedRouter(FIFOMixin, RequestRouter):
    """Send each request to the replica with the least load, where

        load = max(in_flight_seen_here, in_flight_reported) / max_queue + kv_usage

    ``in_flight_reported`` and ``kv_usage`` come from the replica's ``record_routing_stats``
    (refreshed every ``request_routing_stats_period_s``); ``in_flight_seen_here`` counts the
    requests this router sent that have not finished, so a burst between two refreshes spreads
    out instead of piling onto the replica that looked idlest. Ties go in random order."""

    def initialize_state(self, **kwargs):
        self._outstanding: dict[ReplicaID, int] = {}
        self._request_replica: dict[str, ReplicaID] = {}

    def load(self, replica: RunningReplica) -> float:
        stats = replica.routing_stats or {}
        in_flight = max(self._outstanding.get(replica.replica_id, 0), int(stats.get("in_flight", 0)))
        return in_flight / max(1, int(stats.get("max_queue", replica.max_ongoing_requests))) + float(
            stats.get("kv_usage", 0.0))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        shuffled = random.sample(candidate_replicas, len(candidate_replicas))
        return [[r] for r in sorted(shuffled, key=self.load)]  # ranks: the least loaded first

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        self._outstanding[replica_id] = self._outstanding.get(replica_id, 0) + 1
        request_id = getattr(pending_request.metadata, "internal_request_id", None)
        if request_id is not None:
            self._request_replica[request_id] = replica_id

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self._request_replica.pop(internal_request_id, None) is not None:
            self._outstanding[replica_id] = max(0, self._outstanding.get(replica_id, 0) - 1)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        self._outstanding.pop(replica_id, None)
        super().on_replica_actor_died(replica_id)
