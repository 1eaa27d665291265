"""API keys: whether what a request presents is one of a server's keys (``api_keys`` for the API,
``admin_keys`` for the admin API). Every front door checks its requests with it; each door maps a
failed check onto its own answer (HTTP 401, gRPC UNAUTHENTICATED)."""
from __future__ import annotations

import hmac


class Keys:
    """A set of keys (none: every request passes)."""

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
