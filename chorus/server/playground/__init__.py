"""The browser playground (docs/server.md, "Playground"): a static page at ``GET /`` and its
assets under ``/playground/``, shipped as package data beside this module. The page talks to the
server only through the public API (``/v1/models``, ``/v1/voices``, the speech WebSocket with
its word timestamps, ``/ready``, ``/metrics``), so it holds no server logic and needs no
credentials to load: an API key is typed into the page and sent by it with each call."""
from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response

from chorus.server.errors import APIError

PAGE = "index.html"
JS, CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"
ASSETS = {"playground.js": JS, "words.js": JS, "load.js": JS, "playground.css": CSS}  # scripts: ES modules
# Only this origin's scripts, styles and connections (fetch and the WebSocket); no inline code,
# no frames, nothing from elsewhere. The favicon is an inline data: URL (no request, no 404).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def install_playground(app: FastAPI) -> None:
    """Add ``GET /`` (the page) and ``GET /playground/{asset}`` to ``app``; the files are read
    once, here."""
    here = files(__name__)
    page = here.joinpath(PAGE).read_bytes()
    assets = {name: here.joinpath(name).read_bytes() for name in ASSETS}

    @app.get("/", include_in_schema=False)
    async def playground_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/playground/{name}", include_in_schema=False)
    async def playground_asset(name: str) -> Response:
        if name not in assets:
            raise APIError(404, f"the playground has no file {name!r}", code="not_found")
        return Response(assets[name], media_type=ASSETS[name], headers=HEADERS)
