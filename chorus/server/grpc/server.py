"""The gRPC server beside uvicorn, in the same process and event loop, over the same backend:
Riva's ``RivaSpeechSynthesis`` (``servicer.py``), the standard health service
(``grpc.health.v1``: SERVING exactly when ``/ready`` answers 200, for the whole server and for
the Riva service) and server reflection; TLS when a certificate is given. docs/grpc.md."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from pathlib import Path

from grpc import aio, ssl_server_credentials
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from chorus.server.backend import LocalBackend
from chorus.server.grpc.messages import SERVICE
from chorus.server.grpc.servicer import RivaSynthesis
from chorus.server.keys import Keys

logger = logging.getLogger("chorus.server")

HEALTH_INTERVAL_S = 0.25  # how often Watch subscribers see readiness change
MESSAGE_MARGIN = 1 << 20  # room in a request over its zero-shot clip and its text


def receive_limit(config) -> int:
    """The largest request message: a zero-shot clip of ``max_upload_bytes`` plus the text."""
    return config.max_upload_bytes + 4 * config.max_input_chars + MESSAGE_MARGIN


class GrpcDoor:
    """``await start()`` listens on ``config.grpc_port``; ``await stop(grace)`` lets the RPCs in
    flight finish for up to ``grace`` seconds, refusing new ones."""

    def __init__(self, backend: LocalBackend):
        self.backend, self.config = backend, backend.config
        self.server = None
        self._health = None
        self._watching: asyncio.Task | None = None

    async def start(self) -> None:
        config = self.config
        self.server = aio.server(options=[("grpc.max_receive_message_length", receive_limit(config)),
                                          ("grpc.max_send_message_length", -1)])
        self.server.add_generic_rpc_handlers((RivaSynthesis(self.backend, Keys(config.api_keys)).handler(),))
        self._health = _Health(self.backend, ("", SERVICE))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server,
                                            pool=_reflection_pool())
        host = f"[{config.host}]" if ":" in config.host else config.host
        address = f"{host}:{config.grpc_port}"
        if config.grpc_tls_cert is not None:
            credentials = ssl_server_credentials([(Path(config.grpc_tls_key).read_bytes(),
                                                   Path(config.grpc_tls_cert).read_bytes())])
            self.server.add_secure_port(address, credentials)
        else:
            self.server.add_insecure_port(address)
        await self.server.start()
        self._watching = asyncio.create_task(self._health.follow())
        logger.info("gRPC (Riva speech synthesis) on %s%s", address, " with TLS" if config.grpc_tls_cert else "")

    async def stop(self, grace: float) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(grace)


class _Health(health.aio.HealthServicer):
    """Each name's status is the backend's readiness: read at every ``Check``, and every
    ``HEALTH_INTERVAL_S`` for ``Watch`` (:meth:`follow`)."""

    def __init__(self, backend, names):
        super().__init__()
        self.backend, self.names = backend, names

    async def refresh(self) -> None:
        ready = self.backend.readiness()[0]
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.names:
            await self.set(name, status)

    async def Check(self, request, context):
        await self.refresh()
        return await super().Check(request, context)

    async def follow(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(HEALTH_INTERVAL_S)


@functools.cache
def _reflection_pool():
    """Riva's messages, with the health and reflection services', for reflection to describe."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2

    from chorus.server.grpc.messages import pool

    for module in (health_pb2, reflection_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    return pool
