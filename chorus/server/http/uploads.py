"""Reading the multipart uploads of ``POST /v1/voices`` and ``POST /v1/audio/voice-conversion``:
each part bounded by ``max_upload_bytes``, each field checked, every failure a clear 400, 413
or 415."""
from __future__ import annotations

from fastapi import Request
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from chorus.server.errors import APIError, validation_error
from chorus.server.http.middleware import TooLarge
from chorus.server.schemas import ConversionFields
from chorus.server.speech import ConversionForm

# boundaries and part headers around an upload's clips
MULTIPART_OVERHEAD = 64 << 10


def upload_too_large(limit: int, param: str | None) -> APIError:
    """The 413 of an upload with a clip over ``max_upload_bytes`` (``limit``), whether the body's
    size or the clip's own gave it away; ``param``: the clip's field, when known."""
    return APIError(413, f"a clip is larger than this server's upload limit, {limit} bytes (max_upload_bytes)",
                    code="too_large", param=param)


async def _read_form(request: Request, limit: int, *, max_files: int, max_fields: int):
    """The request's multipart form, each part at most ``limit`` bytes (close it when done)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise APIError(415, "upload the clip as multipart/form-data with a 'file' field", code="unsupported_media_type")
    try:
        return await request.form(max_files=max_files, max_fields=max_fields, max_part_size=limit)
    except TooLarge as exc:
        raise exc.error from None
    except StarletteHTTPException as exc:
        if exc.status_code == 408:  # the body's time limit answers for itself
            raise
        raise APIError(400, f"could not read the multipart body: {exc.detail}", code="invalid_multipart") from None
    except Exception as exc:  # noqa: BLE001 - malformed multipart of any kind
        raise APIError(400, f"could not read the multipart body: {exc}", code="invalid_multipart") from None


async def _form_file(form, field: str, limit: int, *, required: bool) -> bytes | None:
    """The bytes of the form's file ``field`` (at most ``limit``)."""
    upload = form.get(field)
    if upload is None and not required:
        return None
    if upload is None or isinstance(upload, str):
        raise APIError(400, f"the multipart body needs a {field!r} field holding a clip (a file part)",
                       code="missing_file", param=field)
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise upload_too_large(limit, field)
    return data


async def read_upload(request: Request, limit: int) -> tuple[bytes, str | None]:
    form = await _read_form(request, limit, max_files=1, max_fields=4)
    try:
        data = await _form_file(form, "file", limit, required=True)
    finally:
        await form.close()
    name = form.get("name")
    if name is not None and not isinstance(name, str):
        raise APIError(400, "name must be a text field, not a file", code="invalid_name", param="name")
    return data, name  # the store checks the name itself


async def read_conversion(request: Request, limit: int) -> ConversionForm:
    """POST /v1/audio/voice-conversion's form: its fields validated, its clips read."""
    form = await _read_form(request, limit, max_files=2, max_fields=12)
    try:
        source = await _form_file(form, "file", limit, required=True)
        clip = await _form_file(form, "voice_file", limit, required=False)
        values = {k: v for k, v in form.multi_items() if k not in ("file", "voice_file")}
    finally:
        await form.close()
    if any(not isinstance(v, str) for v in values.values()):
        field = next(k for k, v in values.items() if not isinstance(v, str))
        raise APIError(400, f"{field} must be a text field, not a file", code="invalid_parameter", param=field)
    try:
        fields = ConversionFields.model_validate(values)
    except ValidationError as exc:
        raise validation_error(exc) from None
    return ConversionForm(fields, source, clip)
