"""The voices routes: ``POST /v1/voices`` (a multipart upload), ``GET /v1/voices``,
``GET`` and ``DELETE /v1/voices/{voice_id}``, each one call on the service."""
from __future__ import annotations

from fastapi import Depends, FastAPI, Request

from chorus.server.errors import APIError
from chorus.server.http.errors import DELETE_ERRORS, ERRORS, UPLOAD_ERRORS
from chorus.server.http.uploads import read_upload
from chorus.server.schemas import VoiceCard, VoiceDeleted, VoiceList


def install_voices(app: FastAPI, service, authorize) -> None:
    """Add the voices routes over ``service`` (a ``Backend``), guarded by ``authorize``."""

    @app.post("/v1/voices", response_model=VoiceCard, status_code=201, responses=UPLOAD_ERRORS,
              dependencies=[Depends(authorize)], tags=["voices"],
              openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                  "type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}, "name": {"type": "string", "maxLength": 128}}}}}}})
    async def create_voice(request: Request):
        """Upload a reference clip (multipart field ``file``, optional ``name``); the same clip
        uploaded twice is one voice."""
        service.require_serving()
        data, name = await read_upload(request, service.config.max_upload_bytes)
        return _voice_card(await service.add_voice(data, name))

    @app.get("/v1/voices", response_model=VoiceList, responses=ERRORS, dependencies=[Depends(authorize)],
             tags=["voices"])
    async def list_voices():
        service.require_serving()
        return VoiceList(data=[_voice_card(i) for i in await service.list_voices()])

    @app.get("/v1/voices/{voice_id}", response_model=VoiceCard, responses=ERRORS,
             dependencies=[Depends(authorize)], tags=["voices"])
    async def get_voice(voice_id: str):
        service.require_serving()
        return _voice_card(await service.voice_info(voice_id))

    @app.delete("/v1/voices/{voice_id}", response_model=VoiceDeleted, responses=DELETE_ERRORS,
                dependencies=[Depends(authorize)], tags=["voices"])
    async def delete_voice(voice_id: str):
        service.require_serving()
        if not await service.delete_voice(voice_id):
            raise APIError(404, f"voice {voice_id!r} does not exist", code="voice_not_found", param="voice_id")
        return VoiceDeleted(id=voice_id, deleted=True)


def _voice_card(info) -> VoiceCard:
    return VoiceCard(id=info.id, name=info.name, created_at=int(info.created_at), duration_s=info.duration_s,
                     variant=info.variant)
