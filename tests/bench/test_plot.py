"""``chorus bench plot``: figures drawn from bench reports, and the reports it refuses."""
from __future__ import annotations

import json

import pytest

from chorus.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _stream_report(path, variant: str, p50_ms: list[float]) -> str:
    levels = [{"concurrency": n, "ttfa_s": {"p50": ms / 1000, "p99": 2 * ms / 1000}}
              for n, ms in zip((1, 16, 64, 256), p50_ms)]
    path.write_text(json.dumps({"variant": variant, "dtype": "bfloat16", "flow_steps": 2, "device_name": "card",
                                "stream": levels}))
    return str(path)


def test_ttfa_draws_a_png_from_stream_reports(tmp_path):
    reports = [_stream_report(tmp_path / "turbo.json", "turbo", [60, 90, 200, 700]),
               _stream_report(tmp_path / "original.json", "original", [120, 180, 400, 1500])]
    out = tmp_path / "ttfa.png"
    assert main(["bench", "plot", "ttfa", str(out), *reports]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_a_report_without_stream_levels_is_refused_by_name(tmp_path, capsys):
    online = tmp_path / "online.json"
    online.write_text(json.dumps({"benchmark": "online", "levels": []}))
    out = tmp_path / "ttfa.png"
    assert main(["bench", "plot", "ttfa", str(out), str(online)]) == 2
    assert f"{online} is not a `chorus bench stream` report" in capsys.readouterr().err
    assert not out.exists()


def test_a_missing_report_is_named(tmp_path, capsys):
    assert main(["bench", "plot", "ttfa", str(tmp_path / "ttfa.png"), "missing.json"]) == 2
    assert "REPORT missing.json: file not found" in capsys.readouterr().err


def test_a_figure_needs_at_least_one_report(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "plot", "ttfa", str(tmp_path / "ttfa.png")])
    assert "the following arguments are required: REPORT" in capsys.readouterr().err
