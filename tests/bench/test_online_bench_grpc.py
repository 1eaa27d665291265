"""``chorus bench online --protocol grpc``: the closed-loop levels and the overload mode sent to
a live server's Riva gRPC door (tiny models on the CPU), measured and reported as over HTTP."""
from __future__ import annotations

import json

import pytest

from chorus.bench.online_bench import OnlineBenchConfig, OverloadConfig
from chorus.bench.online_run import run_online
from tests.bench.test_online_bench import TEXT, _check_level
from tests.server.live import TOKENS, LiveServer, server_config, tiny_loader
from tests.server.test_grpc import free_port

pytest.importorskip("grpc")


def _server(directory, **overrides) -> LiveServer:
    config = server_config(directory, grpc_port=free_port(), **overrides)
    return LiveServer(config, tiny_loader(config))


def _config(server: LiveServer, **fields) -> OnlineBenchConfig:
    return OnlineBenchConfig(url=server.url, protocol="grpc", grpc_target=f"127.0.0.1:{server.config.grpc_port}",
                             text=TEXT, **fields)


def test_the_levels_run_over_grpc_and_report_as_over_http(tmp_path):
    with _server(tmp_path) as server:
        report = run_online(_config(server, concurrency=(1, 4), requests_per_level=6, max_new_tokens=TOKENS))
        server.wait_idle()
    assert json.loads(json.dumps(report)) == report
    assert report["protocol"] == "grpc" and report["warmup"] == {"requests": 1, "ok": 1}
    for level in report["levels"]:
        _check_level(level, level["concurrency"], 6)


def test_overload_over_grpc_counts_resource_exhausted_as_refusals_with_their_delay(tmp_path):
    # as over HTTP (test_online_bench.py): 8 s requests, a 3 s start deadline, a burst at 40/s
    with _server(tmp_path, max_new_tokens=200, start_deadline_s=3.0) as server:
        overload = OverloadConfig(arrival_rate=40.0, requests=40, duration_s=30.0, seed=1)
        report = run_online(_config(server, warmup=0, overload=overload, metrics_interval_s=0.2))
        server.wait_idle()
    result = report["overload"]
    assert result["sent"] == 40 and result["completed"] >= 1
    assert result["rejections"]["codes"].get("overloaded", 0) >= 1, result["status"]
    assert result["rejections"]["with_retry_after"] == 1.0
    assert result["client_errors"] == 0 and result["kv_blocks_used_after_drain"] == 0, result["status"]


def test_grpc_needs_its_target_and_pcm():
    with pytest.raises(ValueError, match="--grpc-target"):
        OnlineBenchConfig(url="http://127.0.0.1:8000", protocol="grpc")
    with pytest.raises(ValueError, match="--response-format pcm"):
        OnlineBenchConfig(url="http://127.0.0.1:8000", protocol="grpc", grpc_target="127.0.0.1:50051",
                          response_format="mp3")
