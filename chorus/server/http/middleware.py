"""What every HTTP request goes through before and after its route, as pure ASGI middleware
(streamed responses pass through untouched): its id and access-log line (``RequestContext``),
the limits on its head, body size and body time (``BodyLimit``), and the early refusal of a
speech request on an overloaded server (``EarlyRefusal``)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid

from starlette.exceptions import HTTPException as StarletteHTTPException

from chorus.server.errors import APIError, StreamCut
from chorus.server.keys import Keys
from chorus.server.http.errors import error_response
from chorus.server.logs import MAX_LOGGED_PATH, clean_for_log, request_id_var
from chorus.server.schemas import SpeechBody

logger = logging.getLogger("chorus.server")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class ExpectedCutFilter(logging.Filter):
    """Drops uvicorn's line for a response that ended without its terminator: the server cuts
    streams on purpose (``StreamCut``) and its access line already says so, with the request id."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "ASGI callable returned without completing response."


EXPECTED_CUT = ExpectedCutFilter()


class HiddenKeysFilter(logging.Filter):
    """Hides the API key a browser's WebSocket sends as ``?api_key=`` in uvicorn's handshake lines
    (``"WebSocket /v1/audio/speech/stream?api_key=..." [accepted]``)."""

    _KEY = re.compile(r"(api_key=)[^&\s\"]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(self._KEY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        return True


HIDDEN_KEYS = HiddenKeysFilter()


class RequestContext:
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
        except ClientGone:
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
                    await error_response(error)(scope, receive, send_with_id)
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


class EarlyRefusal:
    """``POST /v1/audio/speech`` on an overloaded server: when every request of its priority
    would be refused whatever its text (``service.certain_refusal``), answer that 429/503 here,
    before FastAPI routes the request and resolves its dependencies (a third of a refusal's CPU,
    measured; an overloaded server refuses ten times what it serves).
    Other requests go on with the body as read. docs/server.md, "Refusing early"."""

    PATH = "/v1/audio/speech"

    def __init__(self, app, service, keys: Keys):
        self.app, self.service, self.keys = app, service, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.PATH:
            return await self.app(scope, receive, send)
        parts, last = [], None
        while True:  # the body, bounded in size and time by BodyLimit around this
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
            return await send_error(error, send)
        pending = [{"type": "http.request", "body": body, "more_body": False}] + ([last] if last else [])

        async def replay():
            return pending.pop(0) if pending else await receive()

        await self.app(scope, replay, send)

    def refusal(self, headers: dict[bytes, bytes], raw: bytes) -> APIError | None:
        # nothing to do (no body validated twice) unless some priority is being refused; then
        # only a caller with a valid key (others get their 401 and no hint of the load), and only
        # a body the full path would accept (its 400 is never turned into a retryable 429)
        if not self.service.refusing():
            return None
        if self.keys.keys and not self.keys.bearer_matches(headers.get(b"authorization", b"").decode("latin-1")):
            return None
        try:
            body = SpeechBody.model_validate_json(raw)
        except ValueError:  # pydantic's ValidationError, bad JSON included
            return None
        header = headers.get(b"x-chorus-priority")
        return self.service.certain_refusal(body, header.decode("latin-1") if header is not None else None)


class BodyLimit:
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
            return await send_error(APIError(431, f"the request line and headers exceed {self.header_limit} bytes",
                                              code="headers_too_large", headers={"Connection": "close"}), send)
        limit, too_large = self.uploads.get(scope["path"].rstrip("/"), (self.default, None))
        if too_large is None:
            too_large = APIError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            scope.setdefault("state", {})["error_code"] = too_large.code  # the metric's label
            return await send_error(too_large, send)
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
                    raise TooLarge(too_large)
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
        except TooLarge as exc:
            if not started:
                await send_error(exc.error, send)
        except _BodyTimeout as exc:
            if not started:
                await send_error(exc.error, send)
        finally:
            if timer is not None:
                timer.cancel()


class TooLarge(StarletteHTTPException):
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


async def send_error(error: APIError, send) -> None:
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




class ClientGone(BaseException):
    """The client disconnected before its response started: nothing is sent, nothing is held.
    A BaseException, like a cancellation: FastAPI's handlers must not answer it with a 500;
    ``RequestContext`` logs it as the client's leaving."""
