"""Scale-out on Ray Serve: one engine replica per GPU behind the same HTTP API.

One Serve application of two kinds of deployment (docs/scaling.md):

* :class:`EngineReplica`: one :class:`~chorus.server.service.SpeechService` (model, engine,
  admission, canary) per replica, usually one per GPU. It streams speech as ``("start",
  media_type, headers)`` (or ``("error", fields)``) followed by the encoded audio chunks. A
  config with ``models`` has one such deployment per model version (:func:`deployment_name`),
  each with its own replica count or autoscaling bounds.
* :class:`Ingress`: the HTTP layer of ``chorus/server/app.py`` over a :class:`RemoteBackend`,
  which picks the model version of each request (by ``model``, then by weight, sticky per
  request key, as in one process) and forwards the call to one of its replicas through a Serve
  handle chosen by :class:`LeastLoadedRouter` (queue fill plus KV use, not round robin). Its
  ``user_config`` sets the A/B weights without restarting anything (:meth:`Ingress.reconfigure`).

Replicas publish their readiness and Prometheus text every second to a detached
:class:`ReplicaBoard` actor; the front reads it for ``/ready`` and ``/metrics``. Voices live in a
shared directory or object store (content-hashed files), so every replica sees every voice.

``serve run chorus.deploy:app variant=turbo checkpoint=... replicas=2`` or ``serve run
config.yaml`` (an application whose ``import_path`` is ``chorus.deploy:app``) builds the
application with :func:`app`; ``chorus serve --replicas N`` calls :func:`run_local`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, NoReturn

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from chorus.server.config import ServerConfig, build_config
from chorus.server.errors import APIError
from chorus.server.model_entries import ModelEntry, aliases, check_entries, pick_version
from chorus.server.registry import VERSION_HEADER, cards_of, unknown_model
from chorus.server.speech import SpeechResponse

logger = logging.getLogger("chorus.server")

PUBLISH_INTERVAL_S = 1.0  # replicas -> board
BOARD_STALE_S = 10.0  # a replica silent this long is gone (dead, or replaced)
# A replica answers (audio, or an error such as its own 504) within the request's deadline; the
# front waits this much longer before it concludes that no replica can take the request (all
# dead and not yet replaced, or all at their max_ongoing_requests) and answers 503 itself.
FIRST_ANSWER_GRACE_S = 5.0
DEFAULT_LOADER = "chorus.server.main:load_models"
ENGINE = "EngineReplica"  # the engine deployment of a config without models
SCALE_FIELDS = ("replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s",
                "downscale_delay_s", "look_back_period_s", "gpus_per_replica", "loader")
_FLOAT_SCALE_FIELDS = ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s", "look_back_period_s",
                       "gpus_per_replica")
_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


# ------------------------------------------------------------------------------------- routing
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


# ----------------------------------------------------------------------------- the replica board
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


# ------------------------------------------------------------------------------------ replicas
def deployment_name(config: ServerConfig, entry: ModelEntry) -> str:
    """The engine deployment of one model version: ``<id>@<version>`` with ``models`` (``@`` is
    in neither ids nor version labels, so two versions never share a name; Serve refuses only
    ``#``), else ``EngineReplica`` as before several models."""
    return f"{entry.id}@{entry.version}" if config.models else ENGINE


def resolve_loader(spec: str, config: ServerConfig):
    """``"module:function"`` -> a zero-argument loader. ``function(config)`` returns a
    ``Loaded`` or a zero-argument function that does (e.g. the tests' ``tiny_loader``)."""
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)

    def load():
        loaded = fn(config)
        return loaded() if callable(loaded) else loaded

    return load


@serve.deployment(name="EngineReplica", max_ongoing_requests=1024, health_check_period_s=5,
                  health_check_timeout_s=30, graceful_shutdown_timeout_s=20)
class EngineReplica:
    """One engine: a ``SpeechService`` started (loaded, warmed, canary passed) before the replica
    takes traffic. A replica whose start failed raises, so Serve retries it and reports why."""

    async def __init__(self, config: ServerConfig, loader: str = DEFAULT_LOADER):
        from chorus import gc_pauses
        from chorus.server.main import effective_config
        from chorus.server.process_watch import ProcessWatch
        from chorus.server.service import SpeechService

        config = effective_config(config)
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        entry = config.entries()[0]
        # who this replica is, for the front's routing, readiness and metrics labels
        self.identity = {"deployment": context.deployment, "model": entry.id, "version": entry.version}
        self.service = SpeechService(config, resolve_loader(loader, config))
        self._watch = ProcessWatch(self.service.metrics)  # this process's loop lag and GC pauses, for its life
        self._watch.start()
        await self.service.start()
        if self.service.state != "ready":
            await self.service.stop()
            raise RuntimeError(f"the engine replica failed to start: {self.service.failure}")
        if config.gc_freeze:
            gc_pauses.freeze()  # docs/server.md, "Where a short answer waits"
        self._board = board(context.app_name)
        self._publisher = asyncio.create_task(self._publish_loop())

    async def _publish_loop(self) -> None:
        while True:
            try:
                ready, reason = self.service.readiness()
                status = {"ready": ready, "reason": reason, "state": self.service.state,
                          "degradation_level": self.service.degradation_level, "degraded": self.service.degraded(),
                          "pid": os.getpid(), **self.identity}
                await self._board.publish.remote(self.replica_id, status, await self.service.metrics_text())
            except Exception:  # noqa: BLE001 - publishing must not die
                logger.exception("publishing to the replica board failed")
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    async def speech_stream(self, body, priority_header: str | None, request_id: str):
        """``("start", media_type, headers)`` or ``("error", fields)``, then the audio bytes."""
        from chorus.server.logs import request_id_var

        request_id_var.set(request_id)  # this replica's log lines carry the front's request id
        try:
            response = await self.service.speech(body, priority_header, request_id, arrived=time.perf_counter())
        except APIError as exc:
            yield ("error", _error_fields(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a JSON 500, like the single-process server
            logger.exception("speech failed before audio: %s", exc)
            yield ("error", _error_fields(APIError(500, "internal server error; the request id in the "
                                                        "X-Request-Id header finds it in the log",
                                                   code="internal_error")))
            return
        yield ("start", response.media_type, {**response.headers, "X-Chorus-Replica": self.replica_id})
        async for chunk in response.chunks:
            yield chunk

    async def voice(self, method: str, *args):
        """A voice-store call: ("ok", result) or ("error", fields)."""
        try:
            return ("ok", await getattr(self.service, method)(*args))
        except APIError as exc:
            return ("error", _error_fields(exc))

    def readiness(self) -> tuple[bool, str | None]:
        return self.service.readiness()

    async def metrics_text(self) -> bytes:
        return await self.service.metrics_text()

    def pid(self) -> int:
        return os.getpid()

    def replica(self) -> str:
        return self.replica_id

    def record_routing_stats(self) -> dict[str, Any]:
        s = self.service
        return {"in_flight": s.admission.in_flight, "max_queue": s.config.max_queue,
                "kv_usage": s.snapshot.kv_usage, "queue_depth": s.snapshot.t3_waiting}

    async def __del__(self):
        """Serve's graceful shutdown: stop publishing and close the pipeline (its threads)."""
        publisher = getattr(self, "_publisher", None)
        if publisher is not None:
            publisher.cancel()
        service = getattr(self, "service", None)
        if service is not None:
            await service.stop()

    def check_health(self) -> None:
        """Raise (Serve replaces the replica) only when the engine is stalled or dead."""
        s = self.service
        if s.state == "failed":
            raise RuntimeError(f"the engine failed: {s.failure}")
        stall = s.pipeline.stall(s.config.stall_timeout_s) if s.pipeline is not None else None
        if stall is not None:
            raise RuntimeError(f"the engine is stalled: {stall}")


def _error_fields(exc: APIError) -> dict:
    return {"status": exc.status, "message": exc.message, "code": exc.code, "param": exc.param,
            "headers": exc.headers, "type": exc.type}


def _api_error(fields: dict) -> APIError:
    return APIError(fields["status"], fields["message"], code=fields["code"], param=fields["param"],
                    headers=fields["headers"], type=fields["type"])


# --------------------------------------------------------------------------------- the front
class FrontMetrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.errors = Counter("chorus_front_errors", "Error answers the HTTP front sent, by type", ["type"],
                              registry=registry)
        self.retries = Counter("chorus_front_retries",
                               "Speech requests retried on another replica (theirs died before audio)",
                               registry=registry)
        self.stream_cuts = Counter("chorus_front_stream_cuts",
                                   "Responses cut after their first audio byte, by reason", ["reason"],
                                   registry=registry)
        self.replicas = Gauge("chorus_front_replicas", "Engine replicas that published recently, by readiness",
                              ["ready"], registry=registry)


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
                raise ValueError(f"weights: model {model_id!r} is not served here (served: {', '.join(sorted(served))})")
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
                raise _api_error(first[1])
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
                raise _api_error(value)
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


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def merge_metrics(per_replica: dict[str, bytes], labels: Mapping[str, Mapping[str, str]] | None = None) -> bytes:
    """Every replica's samples labelled ``replica="<id>"`` and the replica's ``labels`` (its
    ``model`` and ``version``), and per series (those labels included, so per model version) the
    sum over replicas labelled ``replica="total"``. Counters and gauges add up; a histogram's
    buckets, ``_sum`` and ``_count`` are counters, so their sums are the histogram of all
    requests (every replica uses the same buckets). ``_created`` timestamps are not summed.
    Label values are ids and version labels, which hold no character that needs escaping."""
    meta: dict[str, list[str]] = {}  # family -> its HELP and TYPE lines
    samples: dict[str, list[str]] = {}  # family -> labelled samples (in first-seen order)
    totals: dict[str, dict[tuple[str, str], float]] = {}  # family -> (name, labels) -> sum
    for replica, text in per_replica.items():
        own = ",".join(f'{name}="{value}"' for name, value in (labels or {}).get(replica, {}).items())
        family = None
        for line in text.decode().splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split()[2]
                if line not in meta.setdefault(family, []):
                    meta[family].append(line)
                samples.setdefault(family, [])
                totals.setdefault(family, {})
                continue
            match = _SAMPLE.match(line)
            if match is None or family is None:
                continue
            name, sample_labels, value = match.groups()
            inner = ",".join(part for part in (own, sample_labels[1:-1] if sample_labels else "") if part)
            samples[family].append(f'{name}{{replica="{replica}"{"," + inner if inner else ""}}} {value}')
            if not name.endswith("_created"):
                key = (name, inner)
                totals[family][key] = totals[family].get(key, 0.0) + float(value)
    out: list[str] = []
    for family, lines in samples.items():
        out += meta[family] + lines
        out += [f'{name}{{replica="total"{"," + inner if inner else ""}}} {value!r}'
                for (name, inner), value in totals[family].items()]
    return ("\n".join(out) + "\n").encode() if out else b""


@serve.deployment(name="Ingress", max_ongoing_requests=4096, num_replicas=1)
@serve.ingress()
class Ingress:
    """The HTTP API of ``chorus/server/app.py`` over the engine deployments (``engines``:
    deployment name -> handle, one per model version)."""

    def __init__(self, config: ServerConfig, engines: dict[str, Any]):
        context = serve.get_replica_context()
        self.backend = RemoteBackend(config, engines, context.app_name)

    def __serve_build_asgi_app__(self):
        from chorus.server.app import create_app

        app = create_app(self.backend)
        refuse_admin(app)
        return app

    def reconfigure(self, user_config: dict) -> None:
        """Serve's lightweight update of this deployment's ``user_config`` (``serve deploy`` of a
        config that changes only it restarts nothing): ``{"weights": {id: {version: weight}}}``
        sets the A/B split, versions not named keeping their entry's weight. A bad one is logged
        and changes nothing: raising would make Serve restart the front, which would fail again
        on the same config (docs/scaling.md)."""
        user_config = user_config or {}
        try:
            if not isinstance(user_config, Mapping):
                raise ValueError(f"the user_config must be a table, got {user_config!r}")
            unknown = sorted(set(user_config) - {"weights"})
            if unknown:
                raise ValueError(f"unknown setting(s) {', '.join(map(repr, unknown))}; known: 'weights'")
            self.backend.set_weights(user_config.get("weights") or {})
        except ValueError as exc:
            logger.error("the Ingress user_config was not applied, the A/B weights stay as they were: %s", exc)
            return
        logger.info("A/B weights: %s", {model_id: {d.entry.version: d.entry.weight for d in versions}
                                        for model_id, versions in self.backend.routes.items()})


ADMIN_ON_RAY = ("the admin API (/v1/admin) runs in a one-process server only; on Ray Serve a checkpoint is "
                "swapped by redeploying the application with the changed models entry, and the A/B weights are "
                "the Ingress deployment's user_config (docs/scaling.md, \"Several models\")")


def refuse_admin(app) -> None:
    """``/v1/admin/...`` on the front: 501 ``not_supported``, saying what to do instead (the
    admin API loads and swaps models inside one process; here those are Serve updates)."""

    @app.api_route("/v1/admin/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                   include_in_schema=False)
    async def admin(path: str):
        raise APIError(501, ADMIN_ON_RAY, code="not_supported")


# --------------------------------------------------------------------------------- building
def visible_gpus() -> int:
    """GPUs of the Ray cluster when connected to one (``serve run``, a Serve config, or
    ``chorus serve`` after ``ray.init``), else the CUDA devices this process sees."""
    if ray.is_initialized():
        return int(ray.cluster_resources().get("GPU", 0))
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, no CUDA: no GPUs
        return 0


def replica_count(replicas: str | int) -> int:
    """``auto``: one per visible GPU (1 without a GPU); otherwise the number."""
    if str(replicas).strip().lower() == "auto":
        return max(1, visible_gpus())
    return int(replicas)


def build(config: ServerConfig, *, replicas: str | int = 1, min_replicas: int | None = None,
          max_replicas: int | None = None, target_ongoing_requests: float = 32.0,
          upscale_delay_s: float = 30.0, downscale_delay_s: float = 600.0, look_back_period_s: float = 30.0,
          gpus_per_replica: float | None = None, loader: str = DEFAULT_LOADER):
    """The Serve application: ``Ingress`` over one ``EngineReplica`` deployment per model version
    (:func:`deployment_name`; without ``models``, the one ``EngineReplica``). A version's
    ``replicas``, ``min_replicas`` and ``max_replicas`` are its models entry's where given, else
    these.

    With ``min_replicas`` or ``max_replicas`` Serve autoscales a deployment's replicas on their
    ongoing requests (queued and running, averaged over ``look_back_period_s``): it adds replicas
    when the average per replica stays above ``target_ongoing_requests`` for ``upscale_delay_s``
    and removes them when it stays below for ``downscale_delay_s`` (Serve's defaults; the long
    one suits us: a replica costs a model load and a warm-up to bring back)."""
    from chorus.server.main import effective_config

    config = effective_config(config)
    if gpus_per_replica is None:
        gpus_per_replica = 1.0 if config.device != "cpu" and visible_gpus() > 0 else 0.0
    if config.admin_keys:
        logger.warning("admin_keys are set, but the admin API is not served on Ray Serve (/v1/admin answers 501); "
                       "swaps and A/B weights are Serve updates there (docs/scaling.md)")
    tuning = dict(target_ongoing_requests=float(target_ongoing_requests), upscale_delay_s=float(upscale_delay_s),
                  downscale_delay_s=float(downscale_delay_s), look_back_period_s=float(look_back_period_s))
    engines = {}
    for entry in config.entries():
        name = deployment_name(config, entry)
        scale = _scale(entry.replicas or replicas, _given(entry.min_replicas, min_replicas),
                       _given(entry.max_replicas, max_replicas), tuning)
        engines[name] = EngineReplica.options(
            name=name, ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": 1},
            max_ongoing_requests=config.max_queue + 8,  # admission (429) is the engine's own, above it
            request_router_config=RequestRouterConfig(request_router_class=LeastLoadedRouter,
                                                      request_routing_stats_period_s=0.5,
                                                      request_routing_stats_timeout_s=5.0),
            **scale).bind(config.for_entry(entry) if config.models else config, loader)
    return Ingress.options(ray_actor_options={"num_cpus": 0}).bind(config, engines)


def _given(value: int | None, default: int | None) -> int | None:
    return value if value is not None else default


def _scale(replicas: str | int, min_replicas: int | None, max_replicas: int | None,
           tuning: dict[str, float]) -> dict[str, Any]:
    """One deployment's replica options: a fixed ``num_replicas``, or an ``autoscaling_config``
    between the bounds (either one given), starting at ``replicas`` within them."""
    if min_replicas is None and max_replicas is None:
        return {"num_replicas": replica_count(replicas)}
    low = int(min_replicas if min_replicas is not None else 1)
    high = int(max_replicas if max_replicas is not None else max(low, replica_count(replicas)))
    return {"autoscaling_config": AutoscalingConfig(
        min_replicas=low, max_replicas=high, initial_replicas=min(max(low, replica_count(replicas)), high),
        **tuning)}


def app(args: dict[str, Any]):
    """The application builder of ``serve run chorus.deploy:app key=value ...`` and of a Serve
    config file's ``import_path: chorus.deploy:app`` (``args``: ServerConfig fields, ``models``
    included, plus ``replicas``, ``min_replicas``, ``max_replicas``, ``target_ongoing_requests``,
    ``upscale_delay_s``, ``downscale_delay_s``, ``look_back_period_s``, ``gpus_per_replica``,
    ``loader``; a models entry's own ``replicas``, ``min_replicas``, ``max_replicas`` win for its
    deployment). ``CHORUS_*`` environment variables apply as in ``chorus serve``."""
    args = dict(args or {})
    scale = {k: args.pop(k) for k in SCALE_FIELDS if k in args}
    replicas = scale.pop("replicas", None) or "1"
    config = build_config(args)
    numbers = {k: (float(v) if k in _FLOAT_SCALE_FIELDS else int(v))
               for k, v in scale.items() if k != "loader" and v is not None}
    if "loader" in scale:
        numbers["loader"] = scale["loader"]
    return build(config, replicas=replicas, **numbers)


def run_local(config: ServerConfig) -> None:
    """``chorus serve --replicas N|auto``: a local Ray cluster, the application on
    ``config.host:config.port``, until Ctrl-C or SIGTERM."""
    import signal

    from chorus.server.config import describe
    from chorus.server.logs import setup_logging

    setup_logging(config.log_format, config.log_level)
    logger.info("starting the engine replicas on Ray Serve", extra={"config": describe(config)})
    ray.init(ignore_reinit_error=True, log_to_driver=True)

    def interrupt(*_):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):  # also while starting: Ray's own handler would just exit
        signal.signal(sig, interrupt)
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(build(config, replicas=config.replicas), name="chorus", route_prefix="/", blocking=False)
        logger.info("serving on http://%s:%d: %s", config.host, config.port, ", ".join(
            f"{deployment_name(config, e)} ({replica_count(e.replicas or config.replicas)} replica(s))"
            for e in config.entries()))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        logger.info("shutting down")
    except RuntimeError as exc:  # the replicas failed to start (Serve retried them): the log says why
        raise SystemExit(f"chorus serve: {exc}; the replicas' errors are in the log above") from None
    finally:
        serve.shutdown()
        ray.shutdown()
