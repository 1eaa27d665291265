"""deploy/grafana-dashboard.json stays true to the server: every metric its queries name is one
a live server exposes (or one exported only where it can be measured: ``OPTIONAL_METRICS``),
and every metric the server exposes has a panel."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chorus.server.metrics import OPTIONAL_METRICS

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count"),
            "gauge": ("",)}
_NAME = re.compile(r"\bchorus_[a-zA-Z0-9_]+")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard["panels"]) for t in p.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        exprs.append(query.get("query", "") if isinstance(query, dict) else str(query or ""))
        exprs.append(variable.get("definition", ""))
    return exprs


def _exposed(server) -> tuple[set[str], set[str]]:
    """(every sample name /metrics can carry, every metric family), from the live text: a labelled
    family without samples yet still has its HELP and TYPE lines."""
    names, families = set(), set()
    for family in text_string_to_metric_families(server.client.get("/metrics").text):
        if not family.name.startswith("chorus_") or family.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps come as families of their own
        families.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names, families


def _optional_names() -> set[str]:
    """Sample names of the metrics exported only where they can be measured (GPU gauges)."""
    return {name + suffix for name in OPTIONAL_METRICS for suffix in ("", "_total", "_bucket", "_sum", "_count")}


def test_every_metric_the_dashboard_queries_exists(server, dashboard):
    names, _ = _exposed(server)
    names |= _optional_names()
    used = {name for expr in _queries(dashboard) for name in _NAME.findall(expr)}
    assert used, "the dashboard names no chorus metric"
    assert sorted(used - names) == [], f"not exposed by the server: {sorted(used - names)}"


def test_every_server_metric_has_a_panel(server, dashboard):
    _, families = _exposed(server)
    families |= OPTIONAL_METRICS
    exprs = " ".join(_queries(dashboard))
    missing = sorted(f for f in families if not re.search(rf"\b{f}(_total|_bucket|_sum|_count)?\b", exprs))
    assert missing == [], f"server metrics without a panel on the dashboard: {missing}"


def test_the_dashboard_is_importable(dashboard):
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"] and all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])
        assert all('instance=~"$instance"' in t["expr"] for t in panel["targets"]), panel["title"]
