"""The gRPC front door: NVIDIA Riva's ``RivaSpeechSynthesis`` over the same backend as the HTTP
routes (``chorus serve --grpc-port``; docs/grpc.md). ``proto/`` holds Riva's protos restated and
their compiled descriptor set, ``messages.py`` loads them, ``requests.py`` turns a Riva request
into a speech body, ``audio.py`` encodes the audio as the request asks, ``errors.py`` maps API
errors onto gRPC status codes, ``servicer.py`` serves the RPCs and ``server.py`` runs the server
(health, reflection, TLS) beside uvicorn. Needs ``chorus-tts[grpc]``."""
from __future__ import annotations

EXTRA_HINT = "pip install 'chorus-tts[grpc]'"


def require_grpc() -> None:
    """Raise ``RuntimeError`` naming the extra unless grpcio and its health and reflection
    services are installed."""
    import importlib

    try:
        for module in ("grpc", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection"):
            importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeError(f"grpc_port needs the gRPC packages: {EXTRA_HINT} ({exc})") from None
