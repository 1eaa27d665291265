"""A speech request's checks against the server, before admission: the model it names, its
priority and its body against this server's limits. Arithmetic and string tests only (a request
too long to serve is a 400, never a 429), the same for every front door."""
from __future__ import annotations

import re

from chorus.engine.request import Priority
from chorus.server.config import ServerConfig
from chorus.server.errors import APIError
from chorus.server.schemas import SpeechBody

PRIORITIES = {"high": Priority.HIGH, "normal": Priority.NORMAL, "low": Priority.LOW}

# Unicode's control characters (category Cc: U+0000-U+001F, U+007F-U+009F) but tab and newlines,
# searched in C (every speech request's input is checked, refused ones too)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def check_model(model: str, served: list[str]) -> None:
    """A 400 unless ``model`` is one of ``served`` (ids and aliases)."""
    if model not in served:
        raise unknown_model(model, served)


def unknown_model(model: str, served: list[str]) -> APIError:
    """The 400 of a request whose ``model`` is none of ``served`` (ids and aliases)."""
    return APIError(400, f"model {model!r} is not served here; use one of: {', '.join(served)} (GET /v1/models)",
                    code="model_not_found", param="model")


def priority(field: str | None, given: str | None) -> Priority:
    """The request's priority: the body's ``field``, else ``given`` outside the body (the HTTP
    ``X-Chorus-Priority`` header), else normal."""
    name = field or (given.strip().lower() if given else "normal")
    if name not in PRIORITIES:
        raise APIError(400, f"priority must be high, normal or low, got {name!r}", code="invalid_parameter",
                       param="priority")
    return PRIORITIES[name]


def check_body(body: SpeechBody, config: ServerConfig, variant) -> None:
    """The body's checks against this server's limits and the loaded ``variant``."""
    if len(body.input) > config.max_input_chars:
        raise APIError(400, f"input is {len(body.input)} characters; the limit is {config.max_input_chars} "
                            f"(split the text into several requests)", code="input_too_long", param="input")
    control = _CONTROL.search(body.input)
    if control is not None:
        raise APIError(400, f"input contains the control character U+{ord(control.group()):04X}; send plain text",
                       code="invalid_input", param="input")
    if body.instructions:
        raise APIError(400, f"instructions are not supported by Chatterbox models; {_delivery_advice(variant)}",
                       code="unsupported_parameter", param="instructions")
    cap = config.max_new_tokens
    if cap is not None and body.max_new_tokens is not None and body.max_new_tokens > cap:
        raise APIError(400, f"max_new_tokens must be at most {cap} on this server, got {body.max_new_tokens}",
                       code="invalid_parameter", param="max_new_tokens")
    deadline = body.deadline_s if body.deadline_s is not None else config.default_deadline_s
    if deadline is not None and deadline > config.max_deadline_s:
        raise APIError(400, f"deadline_s must be at most {config.max_deadline_s:g}, got {deadline:g}",
                       code="invalid_parameter", param="deadline_s")


def _delivery_advice(variant) -> str:
    """What steers a variant's delivery, for the error of ``instructions``: the fields it uses
    (``exaggeration`` needs its emotion input, ``cfg_weight`` its CFG); the variants with neither
    (turbo, nano) take paralinguistic tags in their text instead (docs/text.md)."""
    fields = [name for name, used in (("exaggeration", variant.t3.emotion_adv), ("cfg_weight", variant.t3.supports_cfg))
              if used]
    if fields:
        return f"steer delivery with {' and '.join(fields)}"
    return (f"{variant.name} ignores exaggeration and cfg_weight; steer delivery with paralinguistic tags in "
            "the input, such as [laugh] or [sigh]")


def check_sentence_language(language: str | None) -> None:
    """A 400 unless the text splitter knows ``language``'s sentences (a stream cuts its text into
    pieces at sentence ends as it arrives)."""
    from chorus.text.errors import UnsupportedLanguageError
    from chorus.text.sentences import sentence_language

    try:
        sentence_language(language)
    except UnsupportedLanguageError as exc:
        raise APIError(400, str(exc), code="unsupported_language", param="language") from None
