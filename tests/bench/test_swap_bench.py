"""``chorus bench swap`` against a live server of tiny models: the report of a swap under load."""
from __future__ import annotations

import json

from chorus.bench.swap_bench import SwapBenchConfig, run_swap
from chorus.cli import main
from tests.server.live import TOKENS, LiveServer, server_config, tiny_loader

ADMIN = "admin-key-0123456789"
TEXT = "Hello there, this is a swap test."


def test_a_swap_under_load_is_reported_per_phase(tmp_path):
    config = server_config(tmp_path, admin_keys=(ADMIN,))
    with LiveServer(config, tiny_loader(config)) as server:
        report = run_swap(SwapBenchConfig(url=server.url, admin_key=ADMIN, version="2", concurrency=3, before_s=1.0,
                                          after_s=1.0, text=TEXT, max_new_tokens=TOKENS))
    assert json.loads(json.dumps(report)) == report
    assert report["swap"]["status"] == 200 and report["swap"]["seconds"] > 0
    assert report["swap"]["versions"] == {"2": "ready", "1": "retiring"}
    assert report["failed"] == report["cut"] == 0
    phases = report["phases"]
    assert phases["before"]["versions"] == {"1": phases["before"]["ok"]} and phases["before"]["ok"] > 0
    assert set(phases["after"]["versions"]) == {"2"}  # sent after the swap answered: the new version
    assert report["ttfa_p99_during_over_before"] is None or report["ttfa_p99_during_over_before"] > 0


def test_a_failed_swap_is_one_line(tmp_path, capsys):
    config = server_config(tmp_path, admin_keys=(ADMIN,))
    with LiveServer(config, tiny_loader(config)) as server:
        code = main(["bench", "swap", "--url", server.url, "--admin-key", "wrong-key-0123456789", "--version", "2",
                     "--concurrency", "1", "--before-s", "0", "--after-s", "0", "--max-new-tokens", str(TOKENS)])
    assert code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the swap failed" in err[0] and "invalid_admin_key" in err[0]
