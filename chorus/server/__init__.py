"""The voice server: an OpenAI-compatible HTTP API over the speech pipeline (docs/server.md).

    from chorus.server import ServerConfig, SpeechService, create_app

Modules load lazily so ``chorus --help`` stays fast.
"""
_EXPORTS = {"ServerConfig": "config", "DegradationConfig": "config", "build_config": "config",
            "SpeechService": "service", "Loaded": "service", "create_app": "app", "serve": "main",
            "load_models": "main"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chorus.server' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"chorus.server.{module}"), name)
