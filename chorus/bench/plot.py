"""``chorus bench plot``: figures drawn from the JSON reports of the benchmarks.

``ttfa``: time to first audio against concurrency, from ``chorus bench stream`` reports: one line
per report for the median and one (dashed) for p99, on log-log axes. Needs matplotlib.
"""
from __future__ import annotations

import json
from pathlib import Path


def stream_levels(path: str | Path) -> tuple[str, str, list[dict]]:
    """A ``chorus bench stream`` report's line label, card and levels; ``ValueError`` naming the
    file when it is not such a report."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    levels = report.get("stream") if isinstance(report, dict) else None
    if not levels or not all("concurrency" in level and "ttfa_s" in level for level in levels):
        raise ValueError(f"{path} is not a `chorus bench stream` report (it has no stream levels)")
    label = f"{report.get('variant', '?')} ({report.get('dtype', '?')}, {report.get('flow_steps', '?')} flow steps)"
    return label, report.get("device_name") or "?", levels


def plot_ttfa(out: str | Path, reports: list[str | Path]) -> Path:
    """Draw the reports' time to first audio (p50 and p99) against concurrency into ``out`` (PNG)."""
    lines = [stream_levels(path) for path in reports]  # every file checked before drawing
    try:
        import matplotlib
    except ImportError:
        raise ImportError("chorus bench plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, _, levels in lines:
        x = [level["concurrency"] for level in levels]
        line, = ax.plot(x, [level["ttfa_s"]["p50"] * 1000 for level in levels], "o-", label=f"{label} p50")
        ax.plot(x, [level["ttfa_s"]["p99"] * 1000 for level in levels], "s--", color=line.get_color(),
                label=f"{label} p99")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("time to first audio (ms)")
    cards = sorted({card for _, card, _ in lines})
    ax.set_title(f"chorus bench stream on {', '.join(cards)} (random weights)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Path(out)
