"""API errors as gRPC status codes: the service's ``APIError`` (an HTTP status, a code, the field
at fault) becomes the status an operator expects, its message names the Riva field at fault, and
trailing metadata carries Chorus's error code, that field and, for a refusal, the delay to retry
after (``retry-after``, seconds). docs/grpc.md, "Errors"."""
from __future__ import annotations

import grpc

from chorus.server.errors import APIError, StreamCut

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
          409: grpc.StatusCode.ALREADY_EXISTS, 413: grpc.StatusCode.INVALID_ARGUMENT,
          415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
          429: grpc.StatusCode.RESOURCE_EXHAUSTED, 501: grpc.StatusCode.UNIMPLEMENTED,
          503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
          507: grpc.StatusCode.RESOURCE_EXHAUSTED}
_CUTS = {"deadline": grpc.StatusCode.DEADLINE_EXCEEDED, "stopped": grpc.StatusCode.UNAVAILABLE}

# the speech body's fields as Riva's request names them (the rest: custom_configuration keys)
RIVA_FIELDS = {"input": "text", "voice": "voice_name", "language": "language_code",
               "voice_clip": "zero_shot_data.audio_prompt", "timestamps": "enable_word_time_offsets"}
# Riva's own fields, named as they are
RIVA_NAMES = ("text", "language_code", "encoding", "sample_rate_hz", "voice_name", "zero_shot_data",
              "custom_dictionary", "custom_configuration", "authorization")


def riva_field(param: str | None) -> str | None:
    """The Riva request field of a speech body's field (a Riva field stays as it is)."""
    if param is None:
        return None
    if param in RIVA_FIELDS:
        return RIVA_FIELDS[param]
    if param.split(".")[0] in RIVA_NAMES:
        return param
    return f"custom_configuration.{param}"


def status_of(error: APIError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(status code, details, trailing metadata) of an API error."""
    code = _CODES.get(error.status, grpc.StatusCode.INTERNAL)
    field = riva_field(error.param)
    message = error.message
    if field is not None and error.param is not None:
        message = message.removeprefix(f"{error.param}: ")
        message = f"{field}: {message}"
    trailing = [("chorus-error-code", error.code)]
    if field is not None:
        trailing.append(("chorus-error-field", field))
    if error.retry_after_s is not None:
        trailing.append(("retry-after", f"{error.retry_after_s:g}"))
        message = f"{message} (retry after {error.retry_after_s:g} s)"
    return code, message, tuple(trailing)


def cut_status(cut: StreamCut) -> tuple[grpc.StatusCode, str]:
    """The status of a stream that ended early after some audio went out."""
    return _CUTS.get(cut.reason, grpc.StatusCode.INTERNAL), f"the audio was cut: {cut.message}"


def invalid(field: str, message: str) -> APIError:
    """An ``INVALID_ARGUMENT`` of a Riva field that has no speech-body field."""
    return APIError(400, message, code="invalid_parameter", param=field)
