"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can see is an :class:`APIError`, raised by the service or a front door,
so status codes, types and codes are decided in one place per cause. Its ``status`` is an HTTP
status; each door maps it onto its own (``http/errors.py`` answers it as JSON, the WebSocket as
an ``error`` event and a close code).
"""
from __future__ import annotations

from typing import Any

from chorus.pipeline.errors import PipelineError

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

    @property
    def retry_after_s(self) -> float | None:
        """When to retry (the ``Retry-After`` of a 429 or 503), or None."""
        retry = self.headers.get("Retry-After")
        return float(retry) if retry is not None else None


def validation_error(exc) -> APIError:
    """The 400 of a body that fails its schema (``exc``: pydantic's ``ValidationError`` or
    FastAPI's ``RequestValidationError``), naming the first field at fault."""
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
