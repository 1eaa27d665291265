"""The HTTP layer: routes, authentication, limits and response streaming. No model logic lives
here; the backend (``backend.py``: a local ``SpeechService``, or one that forwards to replicas)
answers every question about the model. docs/server.md documents each endpoint, field, header,
limit, metric and error."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
import uuid

from fastapi import Depends, FastAPI, Header, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from chorus.server.errors import APIError, StreamCut, install_error_handlers, validation_error
from chorus.server.logs import MAX_LOGGED_PATH, clean_for_log, request_id_var
from chorus.server.schemas import (ConversionFields, ErrorBody, Health, ModelCard, ModelList, Readiness, SpeechBody,
                                   VoiceCard, VoiceDeleted, VoiceList)
from chorus.server.speech import ConversionForm
from chorus.server.backend import Backend
from chorus.server.registry import affinity_key

logger = logging.getLogger("chorus.server")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_MULTIPART_OVERHEAD = 64 << 10  # boundaries and part headers around an upload
CONVERSION_PATH = "/v1/audio/voice-conversion"
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 404, 413, 429, 500, 503, 504)}
UPLOAD_ERRORS = {**ERRORS, 415: {"model": ErrorBody},  # POST /v1/voices: a body that is not multipart
                 507: {"model": ErrorBody}}  # and a voice store out of space
DELETE_ERRORS = {**ERRORS, 409: {"model": ErrorBody}}  # the built-in voice cannot be deleted


def create_app(service: Backend) -> FastAPI:
    """The HTTP API over ``service``: a :class:`SpeechService` (one process) or another
    :class:`Backend` (e.g. one that forwards to engine replicas)."""
    config = service.config

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(service.start())
        try:
            yield
        finally:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            await service.stop()

    logging.getLogger("uvicorn.error").addFilter(_EXPECTED_CUT)
    logging.getLogger("uvicorn.error").addFilter(_HIDDEN_KEYS)
    app = FastAPI(title="Chorus", summary="A voice server for the Chatterbox TTS family (OpenAI-compatible)",
                  version=_version(), lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)

    def refused_early(headers: dict[bytes, bytes], raw: bytes) -> APIError | None:
        # nothing to do (no body validated twice) unless some priority is being refused; then
        # only a caller with a valid key (others get their 401 and no hint of the load), and only
        # a body the full path would accept (its 400 is never turned into a retryable 429)
        if not service.refusing():
            return None
        if config.api_keys and not bearer_matches(headers.get(b"authorization", b"").decode("latin-1")):
            return None
        try:
            body = SpeechBody.model_validate_json(raw)
        except ValueError:  # pydantic's ValidationError, bad JSON included
            return None
        header = headers.get(b"x-chorus-priority")
        return service.certain_refusal(body, header.decode("latin-1") if header is not None else None)

    app.add_middleware(_EarlyRefusal, refusal=refused_early)
    # an upload's body over its bound has a clip over max_upload_bytes: the same answer as a
    # clip found over it while the form is read (_upload_too_large)
    app.add_middleware(_BodyLimit, default=config.max_body_bytes,
                       uploads={"/v1/voices": (config.max_upload_bytes + _MULTIPART_OVERHEAD,
                                               _upload_too_large(config.max_upload_bytes, "file")),
                                # a source clip and perhaps a target clip
                                CONVERSION_PATH: (2 * config.max_upload_bytes + _MULTIPART_OVERHEAD,
                                                  _upload_too_large(config.max_upload_bytes, None))},
                       timeout_s=config.body_timeout_s,
                       header_limit=config.max_header_bytes)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["X-Request-Id", "X-Chorus-Degradation"])

    app.add_middleware(_RequestContext, record_error=service.record_error)
    generate_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _refine_openapi(generate_openapi(), service)
        return app.openapi_schema

    app.openapi = openapi

    def key_matches(key: str, keys: tuple[str, ...] = config.api_keys) -> bool:
        given = key.strip().encode("utf-8", "surrogateescape")
        matched = False
        for known in keys:  # every key is compared, in constant time, as bytes (any header is safe)
            matched |= hmac.compare_digest(given, known.encode("utf-8"))
        return matched

    def bearer_matches(authorization: str | None, keys: tuple[str, ...] = config.api_keys) -> bool:
        scheme, _, key = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and key_matches(key, keys)

    async def authorize(authorization: str | None = Header(None, include_in_schema=False)) -> None:
        # async: arithmetic only, so it runs on the event loop instead of a worker thread per request
        if config.api_keys and not bearer_matches(authorization):
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    # -- operations ------------------------------------------------------------------------------
    @app.get("/health", response_model=Health, tags=["operations"])
    async def health():
        """The process is alive (it answers while the model loads)."""
        return Health()

    @app.get("/ready", response_model=Readiness, responses={503: {"model": Readiness}}, tags=["operations"])
    async def ready():
        """The model is loaded, the engine is not stalled and a canary synthesis passed recently."""
        ok, reason = service.readiness()
        body = Readiness(ready=ok, state=service.state, reason=reason, degradation_level=service.degradation_level,
                         degraded=service.degraded())
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics():
        """Prometheus text format."""
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(await service.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    # -- models ------------------------------------------------------------------------------------
    @app.get("/v1/models", response_model=ModelList, responses=ERRORS, dependencies=[Depends(authorize)],
             tags=["models"])
    async def list_models():
        """The models served: id, variant, languages and versions (weights and states)."""
        created = int(service.started_at)
        return ModelList(data=[ModelCard(**card, created=created) for card in service.model_cards()])

    @app.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERRORS,
             dependencies=[Depends(authorize)], tags=["models"])
    async def get_model(model_id: str):
        card = next((c for c in service.model_cards() if c["id"] == model_id), None)
        if card is None:
            raise APIError(404, f"model {model_id!r} is not served here", code="model_not_found", param="model")
        return ModelCard(**card, created=int(service.started_at))

    # -- voices ------------------------------------------------------------------------------------
    @app.post("/v1/voices", response_model=VoiceCard, status_code=201, responses=UPLOAD_ERRORS,
              dependencies=[Depends(authorize)], tags=["voices"],
              openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                  "type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}, "name": {"type": "string", "maxLength": 128}}}}}}})
    async def create_voice(request: Request):
        """Upload a reference clip (multipart field ``file``, optional ``name``); the same clip
        uploaded twice is one voice."""
        service.require_serving()
        data, name = await _read_upload(request, config.max_upload_bytes)
        return _voice_card(await service.add_voice(data, name))

    @app.get("/v1/voices", response_model=VoiceList, responses=ERRORS, dependencies=[Depends(authorize)],
             tags=["voices"])
    async def list_voices():
        service.require_serving()
        return VoiceList(data=[_voice_card(i) for i in await service.list_voices()])

    @app.get("/v1/voices/{voice_id}", response_model=VoiceCard, responses=ERRORS,
             dependencies=[Depends(authorize)], tags=["voices"])
    async def get_voice(voice_id: str):
        service.require_serving()
        return _voice_card(await service.voice_info(voice_id))

    @app.delete("/v1/voices/{voice_id}", response_model=VoiceDeleted, responses=DELETE_ERRORS,
                dependencies=[Depends(authorize)], tags=["voices"])
    async def delete_voice(voice_id: str):
        service.require_serving()
        if not await service.delete_voice(voice_id):
            raise APIError(404, f"voice {voice_id!r} does not exist", code="voice_not_found", param="voice_id")
        return VoiceDeleted(id=voice_id, deleted=True)

    # -- speech ------------------------------------------------------------------------------------
    @app.post("/v1/audio/speech", responses={**ERRORS, 200: {"content": {
        "audio/mpeg": {}, "audio/ogg": {}, "audio/aac": {}, "audio/flac": {}, "audio/wav": {}, "audio/pcm": {},
        "text/event-stream": {}}, "description": "the audio, streamed as it is generated"}},
        response_class=Response, dependencies=[Depends(authorize)], tags=["audio"])
    async def speech(body: SpeechBody, request: Request,
                     x_chorus_priority: str | None = Header(None, description="high, normal or low"),
                     x_chorus_affinity: str | None = Header(None, description=AFFINITY_HELP)):
        """Speak ``input``: OpenAI-compatible, plus Chatterbox's and Chorus's fields."""
        opening = asyncio.ensure_future(service.speech(body, x_chorus_priority, request.state.request_id,
                                                       arrived=time.perf_counter(),
                                                       affinity=affinity_key(request.headers)))
        response = await _unless_client_leaves(opening, request)
        return _StallBoundedResponse(response, config.write_stall_s)

    @app.post(CONVERSION_PATH, responses={**UPLOAD_ERRORS, 501: {"model": ErrorBody}, 200: {"content": {
        "audio/mpeg": {}, "audio/ogg": {}, "audio/aac": {}, "audio/flac": {}, "audio/wav": {}, "audio/pcm": {}},
        "description": "the converted audio, streamed as it is generated"}},
        response_class=Response, dependencies=[Depends(authorize)], tags=["audio"],
        openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
            "type": "object", "required": ["file", "model"], "properties": {
                "file": {"type": "string", "format": "binary", "description": "the source speech"},
                "voice_file": {"type": "string", "format": "binary",
                               "description": "the target voice as a reference clip (instead of voice)"},
                **ConversionFields.model_json_schema()["properties"]}}}}}})
    async def voice_conversion(request: Request,
                               x_chorus_priority: str | None = Header(None, description="high, normal or low"),
                               x_chorus_affinity: str | None = Header(None, description=AFFINITY_HELP)):
        """Speak the words of the source clip (``file``) in another voice (``voice``, a voice id,
        or ``voice_file``, a clip); docs/voice-conversion.md."""
        service.require_serving()
        form = await _read_conversion(request, config.max_upload_bytes)
        opening = asyncio.ensure_future(service.convert(form, x_chorus_priority, request.state.request_id,
                                                        arrived=time.perf_counter(),
                                                        affinity=affinity_key(request.headers)))
        response = await _unless_client_leaves(opening, request)
        return _StallBoundedResponse(response, config.write_stall_s)

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
            return await websocket.send_denial_response(error.response())
        query_key = websocket.query_params.get("api_key")
        authorized = not config.api_keys or bearer_matches(websocket.headers.get("authorization")) or (
            query_key is not None and key_matches(query_key))
        await agents.serve(websocket, authorized)

    if hasattr(service, "load_version"):  # a registry of models in this process
        from chorus.server.admin import install_admin

        install_admin(app, service, lambda authorization: bearer_matches(authorization, config.admin_keys))

    if config.playground:
        from chorus.server.playground import install_playground

        install_playground(app)
    return app


# (the header is read by affinity_key; the parameter puts it in the OpenAPI schema)
AFFINITY_HELP = ("a key that keeps related requests (a conversation) on the same version of a model "
                 "split between versions (A/B); default: the API key, else none")


def _refine_openapi(schema: dict, service: Backend) -> dict:
    """What FastAPI cannot know: validation errors are 400s (never FastAPI's 422), and this
    server's limits on the speech body (the models it serves, its input and token caps, its
    longest deadline)."""
    config = service.config
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    body = components.get("SpeechBody", {}).get("properties", {})
    if body:
        body["model"]["enum"] = service.model_ids()
        body["input"]["maxLength"] = config.max_input_chars
        _cap(body["deadline_s"], config.max_deadline_s)
        if config.max_new_tokens is not None:
            _cap(body["max_new_tokens"], config.max_new_tokens)
    return schema


def _cap(prop: dict, maximum: float) -> None:
    """Lower a numeric field's maximum (on its non-null branch when it is optional)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") != "null":
            branch["maximum"] = min(branch.get("maximum", maximum), maximum)


def _voice_card(info) -> VoiceCard:
    return VoiceCard(id=info.id, name=info.name, created_at=int(info.created_at), duration_s=info.duration_s,
                     variant=info.variant)


def _upload_too_large(limit: int, param: str | None) -> APIError:
    """The 413 of an upload with a clip over ``max_upload_bytes`` (``limit``), whether the body's
    size or the clip's own gave it away; ``param``: the clip's field, when known."""
    return APIError(413, f"a clip is larger than this server's upload limit, {limit} bytes (max_upload_bytes)",
                    code="too_large", param=param)


async def _read_form(request: Request, limit: int, *, max_files: int, max_fields: int):
    """The request's multipart form, each part at most ``limit`` bytes (close it when done)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise APIError(415, "upload the clip as multipart/form-data with a 'file' field", code="unsupported_media_type")
    try:
        return await request.form(max_files=max_files, max_fields=max_fields, max_part_size=limit)
    except _TooLarge as exc:
        raise exc.error from None
    except StarletteHTTPException as exc:
        if exc.status_code == 408:  # the body's time limit answers for itself
            raise
        raise APIError(400, f"could not read the multipart body: {exc.detail}", code="invalid_multipart") from None
    except Exception as exc:  # noqa: BLE001 - malformed multipart of any kind
        raise APIError(400, f"could not read the multipart body: {exc}", code="invalid_multipart") from None


async def _form_file(form, field: str, limit: int, *, required: bool) -> bytes | None:
    """The bytes of the form's file ``field`` (at most ``limit``)."""
    upload = form.get(field)
    if upload is None and not required:
        return None
    if upload is None or isinstance(upload, str):
        raise APIError(400, f"the multipart body needs a {field!r} field holding a clip (a file part)",
                       code="missing_file", param=field)
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise _upload_too_large(limit, field)
    return data


async def _read_upload(request: Request, limit: int) -> tuple[bytes, str | None]:
    form = await _read_form(request, limit, max_files=1, max_fields=4)
    try:
        data = await _form_file(form, "file", limit, required=True)
    finally:
        await form.close()
    name = form.get("name")
    if name is not None and not isinstance(name, str):
        raise APIError(400, "name must be a text field, not a file", code="invalid_name", param="name")
    return data, name  # the store checks the name itself


async def _read_conversion(request: Request, limit: int) -> ConversionForm:
    """POST /v1/audio/voice-conversion's form: its fields validated, its clips read."""
    form = await _read_form(request, limit, max_files=2, max_fields=12)
    try:
        source = await _form_file(form, "file", limit, required=True)
        clip = await _form_file(form, "voice_file", limit, required=False)
        values = {k: v for k, v in form.multi_items() if k not in ("file", "voice_file")}
    finally:
        await form.close()
    if any(not isinstance(v, str) for v in values.values()):
        field = next(k for k, v in values.items() if not isinstance(v, str))
        raise APIError(400, f"{field} must be a text field, not a file", code="invalid_parameter", param=field)
    try:
        fields = ConversionFields.model_validate(values)
    except ValidationError as exc:
        raise validation_error(exc) from None
    return ConversionForm(fields, source, clip)


class _ClientGone(BaseException):
    """The client disconnected before its response started: nothing is sent, nothing is held.
    A BaseException, like a cancellation: FastAPI's handlers must not answer it with a 500;
    ``_RequestContext`` logs it as the client's leaving."""


async def _unless_client_leaves(opening: asyncio.Future, request: Request):
    """What ``opening`` (a speech request waiting for its first audio) returns, unless the client
    disconnects first: then the request is cancelled at once (its admission place, T3 rows, KV
    blocks and vocoder work freed) instead of when its first audio would have come, and
    :class:`_ClientGone` ends the route. After the body, the only message a client can send is
    ``http.disconnect``, so a pending ``receive()`` is the disconnect's event."""
    while True:
        leaving = asyncio.ensure_future(request.receive())
        try:
            await asyncio.wait((opening, leaving), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this task was cancelled (the server stops): so is the request
            opening.cancel()
            leaving.cancel()
            raise
        gone = leaving.done() and not leaving.cancelled() and leaving.exception() is None \
            and leaving.result().get("type") == "http.disconnect"
        if not gone:
            if not leaving.done():
                leaving.cancel()
            if opening.done():
                return opening.result()  # the response, or the APIError of a failure before the first audio
            continue  # some other message (none is expected after the body): watch again
        if opening.done():
            if not opening.cancelled() and opening.exception() is None:
                response = opening.result()  # opened as the client left: free what it holds
                await response.chunks.aclose()
                if response.on_close is not None:
                    response.on_close()
        else:
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
        raise _ClientGone()


class _StallBoundedResponse(StreamingResponse):
    """A streamed speech response whose client must keep reading: a write that waits longer
    than ``stall_s`` for the client (uvicorn holds writes while its buffer is full) drops the
    client: the session is told, the body closed (its pipeline request aborted) and the stream
    cut. Server-side buffering per response is then bounded by the transport's buffer and the
    request's own audio."""

    def __init__(self, response, stall_s: float):
        super().__init__(response.chunks, media_type=response.media_type, headers=response.headers)
        self._stall_s, self._on_stall, self._on_close = stall_s, response.on_stall, response.on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # however it ended, the body is closed now (not when it is collected) and its work freed
            await self.body_iterator.aclose()
            if self._on_close is not None:
                self._on_close()

    async def stream_response(self, send) -> None:
        async def bounded_send(message) -> None:
            try:
                await asyncio.wait_for(send(message), self._stall_s)
            except asyncio.TimeoutError:
                if self._on_stall is not None:
                    self._on_stall()
                await self.body_iterator.aclose()
                raise StreamCut("slow_reader", f"the client read nothing for {self._stall_s:g} s") from None

        await super().stream_response(bounded_send)


class _ExpectedCutFilter(logging.Filter):
    """Drops uvicorn's line for a response that ended without its terminator: the server cuts
    streams on purpose (``StreamCut``) and its access line already says so, with the request id."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "ASGI callable returned without completing response."


_EXPECTED_CUT = _ExpectedCutFilter()


class _HiddenKeysFilter(logging.Filter):
    """Hides the API key a browser's WebSocket sends as ``?api_key=`` in uvicorn's handshake lines
    (``"WebSocket /v1/audio/speech/stream?api_key=..." [accepted]``)."""

    _KEY = re.compile(r"(api_key=)[^&\s\"]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(self._KEY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        return True


_HIDDEN_KEYS = _HiddenKeysFilter()


class _RequestContext:
    """Per request: its id (the client's ``X-Request-Id`` when it is a short token, else a new
    one) in a context variable and the response header, one access-log line saying what the
    client got (``outcome``: complete, cut, client_disconnected; ``bytes`` of body), and the
    error counter. A stream cut after its first byte (a ``StreamCut``, or the task cancelled at
    shutdown) is an expected event: it ends the connection without the chunked terminator and
    is logged on the access line, never as a traceback. Pure ASGI, so streamed responses pass
    through untouched and a client disconnect reaches the route at once."""

    def __init__(self, app, record_error):
        self.app, self.record_error = app, record_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else f"req-{uuid.uuid4().hex[:16]}"
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        token = request_id_var.set(request_id)
        started, status = time.perf_counter(), [500]
        sent = {"started": False, "complete": False, "bytes": 0}

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", request_id.encode())]}
            await send(message)
            if message["type"] == "http.response.start":
                sent["started"] = True
            elif message["type"] == "http.response.body":
                sent["bytes"] += len(message.get("body", b""))
                sent["complete"] = sent["complete"] or not message.get("more_body", False)

        cut: StreamCut | None = None
        try:
            await self.app(scope, receive, send_with_id)
        except _ClientGone:
            status[0] = 499  # nginx's "client closed request": nothing was sent
        except StreamCut as exc:
            if not sent["started"]:
                raise
            cut = exc
        except asyncio.CancelledError:  # the server stopped before the response ended
            if sent["started"]:
                cut = StreamCut("shutdown", "the server stopped before the stream ended")
            else:
                cut = StreamCut("shutdown", "the server stopped before the response started")
                error = APIError(503, "the server is shutting down", code="shutting_down",
                                 headers={"Retry-After": "5"})
                state["error_code"] = error.code
                with contextlib.suppress(Exception):
                    await error.response()(scope, receive, send_with_id)
        except Exception:  # a bug: answer, log and count it here, where the request id is known
            if sent["started"]:
                raise  # the response has started: only the connection can be cut
            state["error_code"] = "internal_error"
            logger.exception("internal error")
            await _internal_error(send_with_id)
        finally:
            request_id_var.reset(token)
            code = state.get("error_code")
            probe = scope["path"] in ("/health", "/ready", "/metrics")  # polled often: not logged at info
            path = clean_for_log(scope["path"], MAX_LOGGED_PATH)
            outcome = "complete" if sent["complete"] else "cut" if cut is not None else "client_disconnected"
            extra = {"request_id": request_id, "status": status[0], "error_code": code, "outcome": outcome,
                     "bytes": sent["bytes"], "ms": round(1000 * (time.perf_counter() - started), 1)}
            if outcome == "complete":
                logger.log(logging.DEBUG if probe else logging.INFO, "%s %s %d", scope["method"], path,
                           status[0], extra=extra)
            elif cut is not None:
                extra["cut_reason"] = cut.reason
                logger.warning("%s %s %d cut after %d bytes (%s)", scope["method"], path, status[0],
                               sent["bytes"], cut, extra=extra)
            else:
                logger.info("%s %s %d: the client went away after %d bytes", scope["method"], path,
                            status[0], sent["bytes"], extra=extra)
            if status[0] >= 400 and status[0] != 499 and not probe:  # a 503 from /ready is an answer, not an error
                self.record_error(code or str(status[0]), state.get("error_rule"))


class _EarlyRefusal:
    """``POST /v1/audio/speech`` on an overloaded server: when every request of its priority
    would be refused whatever its text (``refusal(headers, body)`` returns the ``APIError``),
    answer that 429/503 here, before FastAPI routes the request and resolves its dependencies
    (a third of a refusal's CPU, measured; an overloaded server refuses ten times what it serves).
    Other requests go on with the body as read. docs/server.md, "Refusing early"."""

    PATH = "/v1/audio/speech"

    def __init__(self, app, refusal):
        self.app, self.refusal = app, refusal

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.PATH:
            return await self.app(scope, receive, send)
        parts, last = [], None
        while True:  # the body, bounded in size and time by _BodyLimit around this
            message = await receive()
            if message["type"] != "http.request":
                last = message  # the client left: the route sees it after the body
                break
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        error = self.refusal(dict(scope.get("headers") or []), body) if last is None else None
        if error is not None:
            state = scope.setdefault("state", {})
            state["error_code"], state["error_rule"] = error.code, error.rule  # the access line and the metrics
            return await _send_error(error, send)
        pending = [{"type": "http.request", "body": body, "more_body": False}] + ([last] if last else [])

        async def replay():
            return pending.pop(0) if pending else await receive()

        await self.app(scope, replay, send)


class _BodyLimit:
    """Reject a request line and headers over ``header_limit`` bytes (431), and bodies over the
    limit (413) before they are read: by Content-Length, and by
    counting for chunked bodies. Uploads (``uploads``: path -> (limit, its 413); POST /v1/voices
    and /v1/audio/voice-conversion) have their own, larger limits and their own 413. A body
    must also arrive in full within ``timeout_s`` of the request (408 otherwise), so a client
    that trickles it (slowloris) cannot hold a connection and a worker for long."""

    def __init__(self, app, default: int, uploads: dict[str, tuple[int, APIError]], timeout_s: float,
                 header_limit: int):
        self.app, self.default, self.uploads, self.timeout_s = app, default, uploads, timeout_s
        self.header_limit = header_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + sum(
            len(k) + len(v) + 4 for k, v in scope.get("headers") or [])
        if head > self.header_limit:  # the parser bounds what it buffers; this bounds what a request may carry
            scope.setdefault("state", {})["error_code"] = "headers_too_large"
            return await _send_error(APIError(431, f"the request line and headers exceed {self.header_limit} bytes",
                                              code="headers_too_large", headers={"Connection": "close"}), send)
        limit, too_large = self.uploads.get(scope["path"].rstrip("/"), (self.default, None))
        if too_large is None:
            too_large = APIError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            scope.setdefault("state", {})["error_code"] = too_large.code  # the metric's label
            return await _send_error(too_large, send)
        seen = 0
        started = False
        body_done = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        waiting = None  # the task waiting in receive for the body
        expired = False  # the deadline passed before the body was in
        timer = None  # one timer for the whole body (a task per receive, as asyncio.wait_for makes, costs more)

        def expire() -> None:
            nonlocal expired
            expired = True
            if waiting is not None:
                waiting.cancel()  # ends the wait in counting_receive (nothing else is cancelled)

        async def counting_receive():
            nonlocal seen, body_done, waiting, timer
            if body_done:  # after the body only a disconnect can come: wait for it as long as it takes
                return await receive()
            if timer is None:
                timer = loop.call_at(deadline, expire)
            try:
                if expired:  # a message already there still gets in
                    message = await asyncio.wait_for(receive(), 0.05)
                else:
                    waiting = asyncio.current_task()
                    try:
                        message = await receive()
                    finally:
                        waiting = None
            except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
                if not expired:
                    raise  # cancelled from elsewhere (a disconnect, the shutdown)
                task = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and hasattr(task, "uncancel"):
                    task.uncancel()  # Python 3.11+: the cancel was ours, and it ends here
                scope.setdefault("state", {})["error_code"] = "body_timeout"
                raise _BodyTimeout(self.timeout_s) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if seen > limit:
                    scope.setdefault("state", {})["error_code"] = too_large.code
                    raise _TooLarge(too_large)
            else:
                body_done = True
            if body_done:
                timer.cancel()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge as exc:
            if not started:
                await _send_error(exc.error, send)
        except _BodyTimeout as exc:
            if not started:
                await _send_error(exc.error, send)
        finally:
            if timer is not None:
                timer.cancel()


class _TooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a chunked body passes the limit, carrying its 413 ``error``;
    FastAPI re-raises HTTP exceptions met while reading a body, so the error handlers answer 413
    (the upload routes raise ``error`` itself)."""

    def __init__(self, error: APIError):
        super().__init__(413, error.message)
        self.error = error


class _BodyTimeout(StarletteHTTPException):
    """Raised from ``receive`` when the body has not arrived in time (answered 408)."""

    def __init__(self, timeout_s: float):
        message = f"the request body did not arrive within {timeout_s:g} s"
        super().__init__(408, message, headers={"Connection": "close"})
        self.error = APIError(408, message, code="body_timeout", headers={"Connection": "close"})


async def _send_error(error: APIError, send) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((k.lower().encode(), v.encode()) for k, v in error.headers.items())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _internal_error(send) -> None:
    error = APIError(500, "internal server error; the request id in the X-Request-Id header finds it in the log",
                     code="internal_error")
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chorus-tts")
    except PackageNotFoundError:
        return "0+unknown"
