"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can see is an :class:`APIError` raised by a route (or turned into one by
the handlers below), so status codes, types and codes are decided in one place per cause.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from chorus.pipeline.errors import PipelineError
from starlette.routing import Match

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
          415: "invalid_request_error", 431: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable", 504: "timeout_error", 507: "server_error"}


class APIError(Exception):
    """A failure to send to the client: HTTP ``status``, a message for people, the ``param`` at
    fault (or None), a stable machine ``code``, extra headers (e.g. ``Retry-After``) and, for the
    metrics only, the ``rule`` that gave it where one code has several (admission's
    ``overloaded``: ``start`` or ``realtime``)."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 headers: dict[str, str] | None = None, type: str | None = None, rule: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.rule = status, message, code, param, rule
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def validation_error(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}",
                        code="invalid_json")
    if tuple(first.get("loc", ())) == ("body",):  # the body as a whole: missing, or not an object
        return APIError(400, "the request body must be a JSON object (Content-Type: application/json), "
                             f"e.g. {{\"model\": ..., \"input\": ...}}; got {_kind(first.get('input'))}",
                        code="invalid_body")
    location = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(location) or None
    message = first.get("msg", "invalid request")
    if param:
        message = f"{param}: {message}"
    return APIError(400, message, code="invalid_parameter", param=param)


def _kind(value: Any) -> str:
    """What a body that is not a JSON object is, in words."""
    if value is None:
        return "no body"
    if isinstance(value, (bytes, bytearray)):
        return "a body that is not JSON"
    return {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean", int: "a JSON number",
            float: "a JSON number"}.get(type(value), "something else")


def _allowed_methods(request: Request) -> str:
    """Every method the path answers to. Starlette's 405 names only the methods of the first
    route whose path matched, but FastAPI makes one route per method (GET and DELETE of
    /v1/voices/{id} are two routes)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


class StreamCut(Exception):
    """A response that already sent audio ends early (a deadline, a failed step, shutdown, a
    client that stopped reading): the HTTP layer ends the body without its terminator, so the
    client sees a broken transfer, and logs one line. An expected event, not a bug."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


def pipeline_error(error: PipelineError) -> APIError:
    """The API error of a request that failed inside the pipeline before sending audio."""
    if error.reason == "deadline":
        return APIError(504, f"the request was aborted: {error.message}", code="deadline_exceeded")
    if error.reason == "stopped":
        return APIError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
    return APIError(500, f"synthesis failed: {error.message}", code="synthesis_failed")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or Starlette raises through the OpenAI shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        request.state.error_code, request.state.error_rule = exc.code, exc.rule
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        error = validation_error(exc)
        request.state.error_code = error.code
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 408: "body_timeout",
                400: "invalid_body"}.get(exc.status_code, "http_error")
        request.state.error_code = code
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return APIError(exc.status_code, str(exc.detail), code=code, headers=headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        request.state.error_code = "internal_error"
        return APIError(500, "internal server error; the request id in the X-Request-Id header finds it in the log",
                        code="internal_error").response()
