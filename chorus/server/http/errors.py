"""The HTTP answer of every error: an ``APIError`` as its JSON body, and the handlers that route
every error FastAPI or Starlette raises through the same shape."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from chorus.server.errors import APIError, validation_error
from chorus.server.schemas import ErrorBody

# the error answers the OpenAPI schema documents per route
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 404, 413, 429, 500, 503, 504)}
UPLOAD_ERRORS = {**ERRORS, 415: {"model": ErrorBody},  # an upload whose body is not multipart
                 507: {"model": ErrorBody}}  # and a voice store out of space
DELETE_ERRORS = {**ERRORS, 409: {"model": ErrorBody}}  # the built-in voice cannot be deleted


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


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


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or Starlette raises through the OpenAI shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        request.state.error_code, request.state.error_rule = exc.code, exc.rule
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        error = validation_error(exc)
        request.state.error_code = error.code
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 408: "body_timeout",
                400: "invalid_body"}.get(exc.status_code, "http_error")
        request.state.error_code = code
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return error_response(APIError(exc.status_code, str(exc.detail), code=code, headers=headers))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        request.state.error_code = "internal_error"
        return error_response(APIError(500, "internal server error; the request id in the X-Request-Id header "
                                            "finds it in the log", code="internal_error"))
