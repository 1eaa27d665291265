"""The voice store's errors as API errors, for every call a request makes to the store (a
request's voice, and the voices API)."""
from __future__ import annotations

from chorus.server.errors import APIError

_VOICE_STATUS = {"too_large": 413, "reserved_voice": 409, "damaged_voice": 500, "id_collision": 500,
                 "voice_store_unavailable": 503, "insufficient_storage": 507}


def request_voice(store, voice: str):
    """The request's voice by id. A voice is named by its id (what POST /v1/voices returns),
    not by the name it was uploaded with: an unknown id that is a voice's name says so."""
    try:
        return voice_call(store.get, voice, param="voice")
    except APIError as error:
        if error.code != "voice_not_found":
            raise
        try:
            ids = [info.id for info in store.list() if info.name == voice and info.id != voice]
        except Exception:  # noqa: BLE001 - only a hint: the original error stands
            ids = []
        if ids:
            named = " or ".join(repr(i) for i in ids)
            error.message = (f"{voice!r} is the name of a voice, not its id; synthesis takes the voice id that "
                             f"POST /v1/voices returned: \"voice\": {named}")
        else:
            error.message += " (the voice field takes a voice id from POST /v1/voices or GET /v1/voices)"
        raise


def voice_call(fn, *args, param: str = "voice_id", **kwargs):
    """Call the voice store, mapping its errors to API errors (a request's unknown ``voice`` is
    a 400 like any bad parameter; an unknown voice in the path is a 404)."""
    from chorus.voices.store import UnknownVoiceError, VoiceStoreError

    try:
        return fn(*args, **kwargs)
    except UnknownVoiceError as exc:
        raise APIError(400 if param == "voice" else 404, str(exc), code="voice_not_found", param=param) from None
    except VoiceStoreError as exc:
        status = _VOICE_STATUS.get(exc.code, 400)
        raise APIError(status, str(exc), code=exc.code, param="file" if param == "upload" else param) from None
