"""The client a load test's requests go through: httpx for ``POST /v1/audio/speech``, or the
Riva gRPC door's (``--protocol grpc``, grpc_speech.py)."""
from __future__ import annotations

import httpx

from chorus.bench.online_bench import OnlineBenchConfig, auth_headers


def speech_client(cfg: OnlineBenchConfig, connections: int, limits: httpx.Limits, timeout: httpx.Timeout):
    """``async with`` it: httpx with these ``limits`` and ``timeout``, or with ``--protocol grpc``
    ``connections`` gRPC channels."""
    if cfg.protocol == "grpc":
        from chorus.bench.grpc_speech import GrpcSpeechClient

        return GrpcSpeechClient(cfg.grpc_target, cfg.api_key, connections, cfg.timeout_s)
    return httpx.AsyncClient(base_url=cfg.url, headers=auth_headers(cfg.api_key), limits=limits, timeout=timeout)
