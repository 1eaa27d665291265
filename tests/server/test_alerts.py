"""deploy/alerts.yaml stays true to the server: it parses as Prometheus rule groups, every rule
is complete, and every metric an expression names is one the server exports."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.server.test_dashboard import _NAME, _exposed, _optional_names

yaml = pytest.importorskip("yaml")

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "alerts.yaml"


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    document = yaml.safe_load(ALERTS.read_text())
    assert list(document) == ["groups"]
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_rule_is_a_complete_alert(rules):
    assert rules
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "alert names must be unique"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "warn"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_the_rules_cover_stalls_refusals_memory_and_the_vocoder(rules):
    exprs = " ".join(rule["expr"] for rule in rules)
    for name in ("chorus_ready", "chorus_admission_refusals_total", "chorus_gpu_memory_bytes",
                 "chorus_vocoder_busy_ratio", "chorus_stage_seconds_bucket"):
        assert name in exprs, name


def test_every_metric_an_alert_reads_exists(server, rules):
    names, _ = _exposed(server)
    names |= _optional_names()
    used = {name for rule in rules for name in _NAME.findall(rule["expr"])}
    assert sorted(used - names) == [], f"not exported by the server: {sorted(used - names)}"


def test_the_rules_cover_canary_nan_flags_and_dnsmos(rules):
    exprs = " ".join(rule["expr"] for rule in rules)
    for name in ("chorus_canary_degraded", 'reason="nonfinite"', "chorus_audio_flagged_requests_total",
                 "chorus_audio_checked_requests_total", "chorus_dnsmos_score_bucket"):
        assert name in exprs, name
