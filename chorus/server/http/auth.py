"""API keys: whether what a request presents is one of a server's keys (``api_keys`` for the API,
``admin_keys`` for the admin API), and the route dependency that answers 401 when it is not."""
from __future__ import annotations

import hmac

from fastapi import Header

from chorus.server.errors import APIError


class Keys:
    """A set of keys (none: every request passes the dependency of :meth:`dependency`)."""

    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys

    def matches(self, key: str) -> bool:
        given = key.strip().encode("utf-8", "surrogateescape")
        matched = False
        for known in self.keys:  # every key is compared, in constant time, as bytes (any header is safe)
            matched |= hmac.compare_digest(given, known.encode("utf-8"))
        return matched

    def bearer_matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header is ``Bearer <one of the keys>``."""
        scheme, _, key = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and self.matches(key)

    def dependency(self):
        """A route dependency: a 401 unless the request bears a key (when there are keys)."""

        async def authorize(authorization: str | None = Header(None, include_in_schema=False)) -> None:
            # async: arithmetic only, so it runs on the event loop instead of a worker thread per request
            if self.keys and not self.bearer_matches(authorization):
                raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

        return authorize
