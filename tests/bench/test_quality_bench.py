"""``chorus bench quality`` (chorus/bench/quality_bench.py) against a live server over tiny models
and in this process over a tiny pipeline: the report's checks, DNSMOS and the side-by-side plot."""
from __future__ import annotations

import json

import pytest

from chorus.bench.quality_bench import QualityBenchConfig, run_pipeline
from chorus.cli import main
from chorus.quality.dnsmos import available as dnsmos_available
from tests.pipeline.tiny_pipeline import tiny_models
from tests.server.live import TOKENS, LiveServer, server_config, tiny_loader

pytestmark = pytest.mark.timeout(300)

TEXTS = ("Hello there.", " ".join(f"Sentence number {i} is here." for i in range(4)))


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"))
    with LiveServer(config, tiny_loader(config)) as live:
        yield live


def _run(server, tmp_path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["bench", "quality", "--url", server.url, "--text-file", str(_texts(tmp_path)), "--max-new-tokens",
                 str(TOKENS),
                 "--label", name, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_a_server_run_reports_each_requests_checks_and_their_medians(server, tmp_path, capsys):
    report = _run(server, tmp_path, "v1")
    assert json.loads(capsys.readouterr().out) == report
    assert report["bench"] == "quality" and report["label"] == "v1" and report["model"] == "chatterbox-turbo"
    rows = report["requests"]
    assert [r["text"] for r in rows] == list(TEXTS) and [r["seed"] for r in rows] == [0, 1]
    assert all(r["quality"]["audio_seconds"] > 0 for r in rows)
    assert "too_short" in rows[1]["quality"]["flags"]  # 4 chunks of 0.48 s for 111 characters
    summary = report["summary"]
    assert summary["requests"] == 2 and summary["flags"]["too_short"] >= 1
    assert summary["median_audio_seconds"] > 0
    if dnsmos_available():
        assert all(0 < r["dnsmos"]["ovrl"] < 5 for r in rows), [r["dnsmos"] for r in rows]
        assert set(summary["dnsmos_median"]) == {"sig", "bak", "ovrl"}


def test_the_plot_sets_a_run_beside_its_baseline(server, tmp_path):
    _run(server, tmp_path, "before")
    png = tmp_path / "side-by-side.png"
    _run(server, tmp_path, "after", "--baseline", str(tmp_path / "before.json"), "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_baseline_of_other_texts_is_refused(server, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"bench": "quality", "label": "x", "requests": [{"text": "Other."}]}))
    code = main(["bench", "quality", "--url", server.url, "--text-file", str(_texts(tmp_path)), "--max-new-tokens",
                 str(TOKENS), "--baseline", str(other), "--plot", str(tmp_path / "p.png")])
    assert code != 0 and "spoke other texts" in capsys.readouterr().err


def _texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def test_url_or_checkpoint_not_both(tmp_path, capsys):
    assert main(["bench", "quality"]) != 0
    assert "give --url" in capsys.readouterr().err


def test_an_in_process_run_checks_what_the_pipeline_made():
    from chorus.pipeline.pipeline import Pipeline

    with Pipeline(tiny_models("turbo")).start() as pipeline:
        report = run_pipeline(QualityBenchConfig(texts=TEXTS, max_new_tokens=TOKENS, label="here"), pipeline,
                              source="tiny")
    rows = report["requests"]
    assert report["label"] == "here" and report["model"] == "turbo" and len(rows) == 2
    assert rows[0]["quality"]["loop_tokens"] is not None and rows[0]["quality"]["seconds_per_char"] > 0
    assert "too_short" in rows[1]["quality"]["flags"]
