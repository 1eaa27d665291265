"""The engine deployment: one ``SpeechService`` per replica (usually one per GPU), streaming
speech as ``("start", media_type, headers)`` (or ``("error", fields)``) followed by the encoded
audio chunks, and publishing its readiness and metrics to the replica board."""
from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from typing import Any

from ray import serve

from chorus.deploy.replica_board import PUBLISH_INTERVAL_S, board
from chorus.server.config import ServerConfig
from chorus.server.errors import APIError
from chorus.server.model_entries import ModelEntry

logger = logging.getLogger("chorus.server")

DEFAULT_LOADER = "chorus.server.main:load_models"
ENGINE = "EngineReplica"  # the engine deployment of a config without models


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
            yield ("error", error_fields(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a JSON 500, like the single-process server
            logger.exception("speech failed before audio: %s", exc)
            yield ("error", error_fields(APIError(500, "internal server error; the request id in the "
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
            return ("error", error_fields(exc))

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


def error_fields(exc: APIError) -> dict:
    """An ``APIError`` as plain fields, the form it crosses from a replica to the front in."""
    return {"status": exc.status, "message": exc.message, "code": exc.code, "param": exc.param,
            "headers": exc.headers, "type": exc.type}


def api_error(fields: dict) -> APIError:
    """The ``APIError`` of :func:`error_fields`' fields, raised again on the front."""
    return APIError(fields["status"], fields["message"], code=fields["code"], param=fields["param"],
                    headers=fields["headers"], type=fields["type"])

