"""The front's ``Backend`` on Ray Serve: :class:`RemoteBackend` picks the model version of each
request (by ``model``, then by weight, sticky per request key, as in one process) and forwards
the call to one of that version's engine replicas through its Serve handle; it reads the replica
board for readiness and metrics."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, NoReturn

import ray

from chorus.deploy.metrics import FrontMetrics, merge_metrics
from chorus.deploy.replica import api_error, deployment_name
from chorus.deploy.replica_board import PUBLISH_INTERVAL_S, board
from chorus.server.config import ServerConfig
from chorus.server.errors import APIError
from chorus.server.model_entries import ModelEntry, aliases, check_entries, pick_version
from chorus.server.checks import unknown_model
from chorus.server.registry import VERSION_HEADER, cards_of
from chorus.server.speech import SpeechResponse

logger = logging.getLogger("chorus.server")

# A replica answers (audio, or an error such as its own 504) within the request's deadline; the
# front waits this much longer before it concludes that no replica can take the request (all
# dead and not yet replaced, or all at their max_ongoing_requests) and answers 503 itself.
FIRST_ANSWER_GRACE_S = 5.0
_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


@dataclass(frozen=True)
class EngineDeployment:
    """One model version as the front sees it: its entry (with the weight in force) and the
    handle of its engine deployment."""

    entry: ModelEntry
    name: str
    handle: Any


class RemoteBackend:
    """The ``Backend`` of ``chorus/server/backend.py`` over handles to the engine deployments,
    one per model version (``engines``: deployment name -> handle)."""

    def __init__(self, config: ServerConfig, engines: Mapping[str, Any], app_name: str):
        self.config = config
        self.app_name = app_name
        self.started_at = time.time()
        self.metrics = FrontMetrics()
        self.replicas: dict[str, tuple[dict, bytes]] = {}
        self.aliases: dict[str, str] = aliases(config.entries())
        missing = [deployment_name(config, e) for e in config.entries() if deployment_name(config, e) not in engines]
        if missing:
            raise ValueError(f"the front has no handle to the engine deployment(s) {', '.join(missing)}; build "
                             "the application with chorus.deploy.build (or chorus.deploy:app)")
        self._engines = dict(engines)
        self.routes: dict[str, tuple[EngineDeployment, ...]] = self._routes({})
        self._board = None
        self._refresher: asyncio.Task | None = None

    # -- life
    async def start(self) -> None:
        self._board = board(self.app_name)
        await self.refresh()
        self._refresher = asyncio.create_task(self._refresh_loop())

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S / 2)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - keep the last view
                logger.exception("reading the replica board failed")

    async def refresh(self) -> None:
        self.replicas = await self._board.read.remote()
        ready = sum(1 for status, _ in self.replicas.values() if status["ready"])
        self.metrics.replicas.labels("true").set(ready)
        self.metrics.replicas.labels("false").set(len(self.replicas) - ready)

    # -- routes and weights
    def _routes(self, weights: Mapping[str, Mapping[str, int]]) -> dict[str, tuple[EngineDeployment, ...]]:
        """Every id's versions with their entries' weights, or those of ``weights`` ({id:
        {version: weight}}) for the versions it names. Raises ``ValueError`` naming what is wrong."""
        entries = self.config.entries()
        if not isinstance(weights, Mapping):
            raise ValueError(f"weights must be a table of model id: {{version: weight}}, got {weights!r}")
        served = {e.id for e in entries}
        # version labels as text (a YAML config's unquoted 1 is an integer)
        weights = {model_id: {str(label): w for label, w in given.items()} if isinstance(given, Mapping) else given
                   for model_id, given in weights.items()}
        for model_id, given in weights.items():
            if model_id not in served:
                raise ValueError(f"weights: model {model_id!r} is not served here "
                                 f"(served: {', '.join(sorted(served))})")
            if not isinstance(given, Mapping):
                raise ValueError(f"weights of {model_id!r} must be a table of version: weight, got {given!r}")
            labels = {e.version for e in entries if e.id == model_id}
            for label in given:
                if label not in labels:
                    raise ValueError(f"weights: model {model_id!r} has no version {label!r} (it has "
                                     f"{', '.join(sorted(labels))})")
        routes: dict[str, tuple[EngineDeployment, ...]] = {}
        for entry in entries:
            name = deployment_name(self.config, entry)
            given = weights.get(entry.id, {})
            if entry.version in given:
                entry = dataclasses.replace(entry, weight=given[entry.version])
            routes[entry.id] = routes.get(entry.id, ()) + (EngineDeployment(entry, name, self._engines[name]),)
        check_entries([d.entry for versions in routes.values() for d in versions])
        return routes

    def set_weights(self, weights: Mapping[str, Mapping[str, int]]) -> None:
        """The A/B split (the Ingress's ``user_config``): ``{id: {version: weight}}``; a version
        not named has its entry's weight, so ``{}`` is the configured split. The routes are
        replaced whole (a request sees the old split or the new one); on a ``ValueError``
        nothing changes."""
        self.routes = self._routes(weights)

    def deployments(self) -> list[EngineDeployment]:
        return [d for versions in self.routes.values() for d in versions]

    def _statuses(self, deployment: EngineDeployment) -> list[dict]:
        return [status for status, _ in self.replicas.values() if status.get("deployment") == deployment.name]

    def _version_state(self, deployment: EngineDeployment) -> str:
        """``ready`` when a replica of the version is, else the state of one (none: starting)."""
        states = [status["state"] for status in self._statuses(deployment)]
        return "ready" if "ready" in states else (states[0] if states else "starting")

    def _serves(self, versions: tuple[EngineDeployment, ...]) -> bool:
        return any(self._version_state(d) == "ready" for d in versions)

    def _unready(self, model_id: str, versions: tuple[EngineDeployment, ...]) -> str | None:
        """Why no replica of ``model_id`` is ready (None: one is)."""
        statuses = [status for d in versions for status in self._statuses(d)]
        if any(status["ready"] for status in statuses):
            return None
        where = f"model {model_id}: " if self.config.models else ""
        if not statuses:
            return where + "no engine replica is up yet"
        reasons = sorted({status["reason"] or status["state"] for status in statuses})
        return where + "no engine replica is ready: " + "; ".join(reasons)

    # -- state
    @property
    def state(self) -> str:
        if all(self._serves(versions) for versions in self.routes.values()):
            return "ready"
        states = [status["state"] for d in self.deployments() for status in self._statuses(d)]
        return next((s for s in states if s != "ready"), "starting")

    def readiness(self) -> tuple[bool, str | None]:
        """Ready when every model has a ready replica."""
        for model_id, versions in self.routes.items():
            why = self._unready(model_id, versions)
            if why is not None:
                return False, why
        return True, None

    def degraded(self) -> list[str]:
        return sorted(f"replica {replica}: {why}" for replica, (status, _) in self.replicas.items()
                      for why in status.get("degraded", ()))

    @property
    def degradation_level(self) -> int:
        levels = [status["degradation_level"] for status, _ in self.replicas.values() if status["ready"]]
        return min(levels) if levels else 0

    def require_serving(self) -> None:
        """A 503 unless some replica serves (what is not one model's: the voice library)."""
        if not any(self._serves(versions) for versions in self.routes.values()):
            self._not_ready(self.readiness()[1] or "no engine replica is ready")

    def _not_ready(self, why: str) -> NoReturn:
        raise APIError(503, f"not ready: {why}", code="not_ready",
                       headers={"Retry-After": str(max(self.config.retry_after_s, 5))})

    def model_ids(self) -> list[str]:
        return [*self.routes, *self.aliases]

    def pick(self, model: str, key: str) -> EngineDeployment:
        """The version that serves a request for ``model`` with request key ``key`` (the same
        rule as one process: ``model_entries.pick_version``); 503 when none of its replicas serves."""
        model_id = self.aliases.get(model, model)
        versions = self.routes.get(model_id)
        if versions is None:
            raise unknown_model(model, self.model_ids())
        if not self._serves(versions):
            self._not_ready(self._unready(model_id, versions) or f"model {model_id} has no ready replica")
        return pick_version(model_id, key, versions, weight=lambda d: d.entry.weight,
                            ready=lambda d: self._version_state(d) == "ready")

    def model_cards(self) -> list[dict]:
        return cards_of([(model_id, versions[0].entry.variant,
                          [dict(version=d.entry.version, weight=d.entry.weight, state=self._version_state(d))
                           for d in versions]) for model_id, versions in self.routes.items()], self.aliases)

    async def convert(self, form, priority_header: str | None, request_id: str, *, arrived: float,
                      affinity: str | None = None):
        raise APIError(501, "voice conversion needs a single-process server (--replicas 1) for now",
                       code="not_supported")

    def refusing(self) -> bool:
        """False: each replica admits for itself."""
        return False

    def certain_refusal(self, body, priority_header: str | None) -> None:
        """None: each replica admits for itself, so the front cannot refuse for them."""
        return None

    # -- speech
    async def speech(self, body, priority_header: str | None, request_id: str, *, arrived: float,
                     affinity: str | None = None) -> SpeechResponse:
        version = self.pick(body.model, affinity or request_id)
        # a replica answers (first audio or an error) within the start deadline (replicas run on
        # GPUs unless the device says otherwise) or the request's own shorter total deadline
        start_s = self.config.start_deadline_for("cpu" if self.config.device == "cpu" else "cuda")
        wait_s = min(start_s, body.deadline_s or start_s) + FIRST_ANSWER_GRACE_S
        for attempt in (1, 2):
            stream = version.handle.options(stream=True).speech_stream.remote(body, priority_header, request_id)
            try:
                first = await asyncio.wait_for(stream.__anext__(), wait_s)
            except asyncio.TimeoutError:
                stream.cancel()
                raise APIError(503, f"no engine replica answered within {wait_s:g} s (all are down, being "
                                    "replaced or full); retry", code="replica_unavailable",
                               headers={"Retry-After": str(max(self.config.retry_after_s, 5))}) from None
            except _LOST as exc:
                if attempt == 1:
                    self.metrics.retries.inc()
                    logger.warning("engine replica lost before audio; retrying on another: %s", type(exc).__name__)
                    continue
                raise APIError(503, "the engine replica serving this request was lost before sending audio, "
                                    "twice; retry", code="replica_lost", headers={"Retry-After": "1"}) from None
            except BaseException:
                stream.cancel()
                raise
            if first[0] == "error":
                raise api_error(first[1])
            _, media_type, headers = first
            return SpeechResponse(media_type, {**headers, VERSION_HEADER: version.entry.version},
                                  self._pass_through(stream))
        raise AssertionError("unreachable")

    async def _pass_through(self, stream) -> AsyncIterator[bytes]:
        """The replica's chunks as they come (no buffering); a replica lost mid-stream cuts it."""
        finished = False
        try:
            async for chunk in stream:
                yield chunk
            finished = True
        except _LOST as exc:
            self.metrics.stream_cuts.labels("replica_lost").inc()
            logger.error("stream cut after audio was sent: the engine replica was lost (%s)", type(exc).__name__)
            raise
        finally:
            if not finished:
                stream.cancel()

    # -- voices (the store is shared: any replica answers)
    def _voice_handle(self):
        """A ready version's deployment (each builds a voice from the shared clip on first use)."""
        deployments = self.deployments()
        return next((d.handle for d in deployments if self._version_state(d) == "ready"), deployments[0].handle)

    async def _voice(self, method: str, *args):
        for attempt in (1, 2):
            try:
                kind, value = await self._voice_handle().voice.remote(method, *args)
            except _LOST:
                if attempt == 2:
                    raise APIError(503, "the engine replica was lost; retry", code="replica_lost",
                                   headers={"Retry-After": "1"}) from None
                continue
            if kind == "error":
                raise api_error(value)
            return value

    async def add_voice(self, data: bytes, name: str | None):
        return await self._voice("add_voice", data, name)

    async def list_voices(self) -> list:
        return await self._voice("list_voices")

    async def voice_info(self, voice_id: str):
        return await self._voice("voice_info", voice_id)

    async def delete_voice(self, voice_id: str) -> bool:
        return await self._voice("delete_voice", voice_id)

    # -- metrics
    async def metrics_text(self) -> bytes:
        from prometheus_client import generate_latest

        per_replica = {replica: text for replica, (_, text) in sorted(self.replicas.items())}
        labels = {replica: {"model": status["model"], "version": status["version"]}
                  for replica, (status, _) in self.replicas.items() if "model" in status}
        return generate_latest(self.metrics.registry) + merge_metrics(per_replica, labels)

    def record_error(self, code: str) -> None:
        self.metrics.errors.labels(code).inc()
