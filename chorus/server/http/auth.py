"""The HTTP routes' API-key check: a route dependency that answers 401 unless the request bears
one of the server's keys (``chorus.server.keys``)."""
from __future__ import annotations

from fastapi import Header

from chorus.server.errors import APIError
from chorus.server.keys import Keys


def require_key(keys: Keys):
    """A route dependency: a 401 unless the request bears a key (when there are keys)."""

    async def authorize(authorization: str | None = Header(None, include_in_schema=False)) -> None:
        # async: arithmetic only, so it runs on the event loop instead of a worker thread per request
        if keys.keys and not keys.bearer_matches(authorization):
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return authorize
