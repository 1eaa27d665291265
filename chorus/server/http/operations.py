"""The operations routes, open to every caller: ``/health`` (liveness), ``/ready`` (readiness)
and ``/metrics`` (Prometheus)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from chorus.server.schemas import Health, Readiness


def install_operations(app: FastAPI, service) -> None:
    """Add the operations routes over ``service`` (a ``Backend``)."""

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
