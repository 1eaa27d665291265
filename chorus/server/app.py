"""The server's front doors over one backend, put together: the HTTP routes (``http/``: speech,
voices, models and admin, operations), their middleware and error answers, the voice-agent
WebSocket (``ws_agent.py``) and the playground. No model logic lives here; the backend
(``backend.py``: a :class:`ModelRegistry` of ``SpeechService``, or one that forwards to replicas)
answers every question about the model. docs/server.md documents each endpoint, field, header,
limit, metric and error."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, WebSocket

from chorus.server.backend import Backend
from chorus.server.errors import APIError
from chorus.server.http.auth import require_key
from chorus.server.http.errors import error_response, install_error_handlers
from chorus.server.http.middleware import EXPECTED_CUT, HIDDEN_KEYS, BodyLimit, EarlyRefusal, RequestContext
from chorus.server.http.models import install_admin, install_models
from chorus.server.http.openapi import refine_openapi
from chorus.server.http.operations import install_operations
from chorus.server.http.speech import CONVERSION_PATH, install_speech
from chorus.server.http.uploads import MULTIPART_OVERHEAD, upload_too_large
from chorus.server.http.voices import install_voices
from chorus.server.keys import Keys


def create_app(service: Backend) -> FastAPI:
    """The HTTP API over ``service``: a :class:`ModelRegistry` (one process) or another
    :class:`Backend` (e.g. one that forwards to engine replicas)."""
    config = service.config

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(service.start())
        grpc_door = None
        try:
            if config.grpc_port is not None:  # the gRPC door: same process, same loop (docs/grpc.md)
                from chorus.server.grpc import require_grpc

                require_grpc()
                from chorus.server.grpc.server import GrpcDoor

                grpc_door = GrpcDoor(service)
                await grpc_door.start()
            yield
        finally:
            if grpc_door is not None:  # RPCs in flight get the shutdown grace; new ones are refused
                await grpc_door.stop(config.shutdown_grace_s)
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            await service.stop()

    logging.getLogger("uvicorn.error").addFilter(EXPECTED_CUT)
    logging.getLogger("uvicorn.error").addFilter(HIDDEN_KEYS)
    app = FastAPI(title="Chorus", summary="A voice server for the Chatterbox TTS family (OpenAI-compatible)",
                  version=_version(), lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)
    keys = Keys(config.api_keys)

    app.add_middleware(EarlyRefusal, service=service, keys=keys)
    # an upload's body over its bound has a clip over max_upload_bytes: the same answer as a
    # clip found over it while the form is read (upload_too_large)
    app.add_middleware(BodyLimit, default=config.max_body_bytes,
                       uploads={"/v1/voices": (config.max_upload_bytes + MULTIPART_OVERHEAD,
                                               upload_too_large(config.max_upload_bytes, "file")),
                                # a source clip and perhaps a target clip
                                CONVERSION_PATH: (2 * config.max_upload_bytes + MULTIPART_OVERHEAD,
                                                  upload_too_large(config.max_upload_bytes, None))},
                       timeout_s=config.body_timeout_s,
                       header_limit=config.max_header_bytes)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["X-Request-Id", "X-Chorus-Degradation"])

    app.add_middleware(RequestContext, record_error=service.record_error)
    generate_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = refine_openapi(generate_openapi(), service)
        return app.openapi_schema

    app.openapi = openapi
    authorize = require_key(keys)
    install_operations(app, service)
    install_models(app, service, authorize)
    install_voices(app, service, authorize)
    install_speech(app, service, authorize)

    # -- voice agents (docs/voice-agents.md) ---------------------------------------------------
    agents = None
    if hasattr(service, "hold_drain"):  # models in this process (not a front of remote replicas)
        from chorus.server.ws_agent import AgentHub

        agents = AgentHub(service)
    app.state.agents = agents

    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(websocket: WebSocket):
        """Text deltas in, audio out, over one WebSocket (protocol: docs/voice-agents.md). The
        API key comes in the Authorization header or, from browsers, as ``?api_key=``."""
        if agents is None:
            error = APIError(501, "the voice-agent WebSocket needs a single-process server (--replicas 1)",
                             code="not_supported")
            return await websocket.send_denial_response(error_response(error))
        query_key = websocket.query_params.get("api_key")
        authorized = not config.api_keys or keys.bearer_matches(websocket.headers.get("authorization")) or (
            query_key is not None and keys.matches(query_key))
        await agents.serve(websocket, authorized)

    if hasattr(service, "load_version"):  # a registry of models in this process
        install_admin(app, service)

    if config.playground:
        from chorus.server.playground import install_playground

        install_playground(app)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chorus-tts")
    except PackageNotFoundError:
        return "0+unknown"
