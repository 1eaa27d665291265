"""The HTTP front on Ray Serve: the API of ``chorus/server/app.py`` over a
:class:`~chorus.deploy.backend.RemoteBackend`, its ``user_config`` setting the A/B weights
without restarting anything, and the admin API refused (it runs in a one-process server only)."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from ray import serve

from chorus.deploy.backend import RemoteBackend
from chorus.server.config import ServerConfig
from chorus.server.errors import APIError

logger = logging.getLogger("chorus.server")


@serve.deployment(name="Ingress", max_ongoing_requests=4096, num_replicas=1)
@serve.ingress()
class Ingress:
    """The HTTP API of ``chorus/server/app.py`` over the engine deployments (``engines``:
    deployment name -> handle, one per model version)."""

    def __init__(self, config: ServerConfig, engines: dict[str, Any]):
        context = serve.get_replica_context()
        self.backend = RemoteBackend(config, engines, context.app_name)

    def __serve_build_asgi_app__(self):
        from chorus.server.app import create_app

        app = create_app(self.backend)
        refuse_admin(app)
        return app

    def reconfigure(self, user_config: dict) -> None:
        """Serve's lightweight update of this deployment's ``user_config`` (``serve deploy`` of a
        config that changes only it restarts nothing): ``{"weights": {id: {version: weight}}}``
        sets the A/B split, versions not named keeping their entry's weight. A bad one is logged
        and changes nothing: raising would make Serve restart the front, which would fail again
        on the same config (docs/scaling.md)."""
        user_config = user_config or {}
        try:
            if not isinstance(user_config, Mapping):
                raise ValueError(f"the user_config must be a table, got {user_config!r}")
            unknown = sorted(set(user_config) - {"weights"})
            if unknown:
                raise ValueError(f"unknown setting(s) {', '.join(map(repr, unknown))}; known: 'weights'")
            self.backend.set_weights(user_config.get("weights") or {})
        except ValueError as exc:
            logger.error("the Ingress user_config was not applied, the A/B weights stay as they were: %s", exc)
            return
        logger.info("A/B weights: %s", {model_id: {d.entry.version: d.entry.weight for d in versions}
                                        for model_id, versions in self.backend.routes.items()})


ADMIN_ON_RAY = ("the admin API (/v1/admin) runs in a one-process server only; on Ray Serve a checkpoint is "
                "swapped by redeploying the application with the changed models entry, and the A/B weights are "
                "the Ingress deployment's user_config (docs/scaling.md, \"Several models\")")


def refuse_admin(app) -> None:
    """``/v1/admin/...`` on the front: 501 ``not_supported``, saying what to do instead (the
    admin API loads and swaps models inside one process; here those are Serve updates)."""

    @app.api_route("/v1/admin/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                   include_in_schema=False)
    async def admin(path: str):
        raise APIError(501, ADMIN_ON_RAY, code="not_supported")
