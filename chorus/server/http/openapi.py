"""The OpenAPI schema at /openapi.json, refined with what only this server knows."""
from __future__ import annotations


def refine_openapi(schema: dict, service) -> dict:
    """What FastAPI cannot know: validation errors are 400s (never FastAPI's 422), and this
    server's limits on the speech body (the models it serves, its input and token caps, its
    longest deadline)."""
    config = service.config
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    body = components.get("SpeechBody", {}).get("properties", {})
    if body:
        body["model"]["enum"] = service.model_ids()
        body["input"]["maxLength"] = config.max_input_chars
        _cap(body["deadline_s"], config.max_deadline_s)
        if config.max_new_tokens is not None:
            _cap(body["max_new_tokens"], config.max_new_tokens)
    return schema


def _cap(prop: dict, maximum: float) -> None:
    """Lower a numeric field's maximum (on its non-null branch when it is optional)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") != "null":
            branch["maximum"] = min(branch.get("maximum", maximum), maximum)
