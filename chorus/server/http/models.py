"""The models routes: ``GET /v1/models`` and ``/v1/models/{model_id}`` (what is served), and the
admin API (docs/models.md, "Admin API"): load, swap and unload model versions and set A/B
weights on a running server. The admin API answers only requests that bear an admin key
(``admin_keys``); a server without admin keys has no admin API (every admin path is 404)."""
from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Header
from pydantic import BaseModel, ConfigDict, Field

from chorus.server.errors import APIError
from chorus.server.keys import Keys
from chorus.server.http.errors import ERRORS
from chorus.server.model_entries import VERSION_RE
from chorus.server.schemas import ErrorBody, ModelCard, ModelList


def install_models(app: FastAPI, service, authorize) -> None:
    """Add the models routes over ``service`` (a ``Backend``), guarded by ``authorize``."""

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS, dependencies=[Depends(authorize)],
             tags=["models"])
    async def list_models():
        """The models served: id, variant, languages and versions (weights and states)."""
        created = int(service.started_at)
        return ModelList(data=[ModelCard(**card, created=created) for card in service.model_cards()])

    @app.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERRORS,
             dependencies=[Depends(authorize)], tags=["models"])
    async def get_model(model_id: str):
        card = next((c for c in service.model_cards() if c["id"] == model_id), None)
        if card is None:
            raise APIError(404, f"model {model_id!r} is not served here", code="model_not_found", param="model")
        return ModelCard(**card, created=int(service.started_at))


ADMIN_ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 404, 409, 422, 503)}


class LoadBody(BaseModel):
    """A model version to load: its label, and what differs from the versions it joins or replaces."""

    model_config = ConfigDict(extra="forbid")
    version: str = Field(description="the new version's label (unique per model)")
    checkpoint: str | None = Field(None, description="a directory in the official layout or a hub id")
    variant: str | None = Field(None, description="needed only for a model new to the server")
    weight: int | None = Field(None, ge=0, description="serve beside the other versions with this weight (A/B); "
                                                         "omitted: replace them (swap)")
    memory_share: float | None = Field(None, gt=0, le=1)
    kv_cache_bytes: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    vocoder_max_batch_items: int | None = Field(None, gt=0)


class WeightsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weights: dict[str, int] = Field(description="version label -> weight (>= 0); versions not named keep theirs")


class VersionRow(BaseModel):
    id: str
    version: str
    variant: str
    checkpoint: str | None
    weight: int
    memory_share: float | None
    state: str = Field(description="starting, loading, warming, ready, failed, draining, or retiring (no new "
                                   "requests; unloaded once its work in flight has finished)")
    failure: str | None
    in_flight: int


class AdminModel(BaseModel):
    id: str
    versions: list[VersionRow]


class AdminModels(BaseModel):
    data: list[VersionRow]


def install_admin(app: FastAPI, registry) -> None:
    """Add the ``/v1/admin`` routes for ``registry`` (a :class:`ModelRegistry`)."""
    admin_keys = Keys(registry.config.admin_keys)

    async def authorize_admin(authorization: str | None = Header(None, include_in_schema=False)) -> None:
        if not admin_keys.keys:
            raise APIError(404, "the admin API is off on this server: start it with admin_keys to turn it on",
                           code="not_found")
        if not admin_keys.bearer_matches(authorization):
            raise APIError(401, "missing or invalid admin key: send 'Authorization: Bearer <admin key>'",
                           code="invalid_admin_key", headers={"WWW-Authenticate": "Bearer"})

    guard = dict(dependencies=[Depends(authorize_admin)], responses=ADMIN_ERRORS, tags=["admin"])

    @app.get("/v1/admin/models", response_model=AdminModels, **guard)
    async def admin_models():
        """Every loaded version, those retiring included, with its weight, state and work in flight."""
        return AdminModels(data=[VersionRow(**row) for row in registry.describe()])

    @app.post("/v1/admin/models/{model_id}/load", response_model=AdminModel, **guard)
    async def load(model_id: str, body: LoadBody):
        """Load a version beside what serves (warm-up and canary included), then route to it:
        alone (a swap: the versions it replaces finish their work in flight, then unload) or,
        with ``weight``, beside the others (A/B). Answers once traffic has moved; a failed load
        changes nothing (422 ``load_failed``, with the cause)."""
        if not VERSION_RE.fullmatch(body.version):
            raise APIError(400, f"version {body.version!r} must be 1-64 characters of letters, digits and "
                                "'.', '_', '+', '-'", code="invalid_parameter", param="version")
        settings: dict[str, Any] = body.model_dump(exclude_none=True, exclude={"version"})
        return AdminModel(**await registry.load_version(model_id, settings, body.version))

    @app.put("/v1/admin/models/{model_id}/weights", response_model=AdminModel, **guard)
    async def weights(model_id: str, body: WeightsBody):
        """Set the A/B weights of some of the model's versions."""
        if any(w < 0 for w in body.weights.values()):
            raise APIError(400, "weights must be >= 0", code="invalid_parameter", param="weights")
        return AdminModel(**await registry.set_weights(model_id, body.weights))

    @app.delete("/v1/admin/models/{model_id}/versions/{version}", response_model=AdminModel, **guard)
    async def unload(model_id: str, version: str):
        """Stop routing to a version; it unloads once its work in flight has finished."""
        return AdminModel(**await registry.unload_version(model_id, version))
