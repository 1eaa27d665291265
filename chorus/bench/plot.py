"""``chorus bench plot``: figures drawn from the JSON reports of the benchmarks.

- ``ttfa``: time to first audio against concurrency, from ``chorus bench stream`` reports: one
  line per report for the median and one (dashed) for p99, on log-log axes.
- ``throughput``: delivered audio seconds per second against clients, from ``chorus bench
  online`` reports: one line per report.
- ``roofline``: one pass (``bench vocoder --roofline``) or decode step (``bench t3 --roofline``)
  against the card's roof, drawn by the code that draws it during the run
  (:func:`chorus.bench.roofline.write_plot`).

Every figure is a :class:`matplotlib.figure.Figure` on its own Agg canvas (no pyplot state); each
function returns it after writing the PNG. Needs matplotlib (the ``[bench]`` extra).
"""
from __future__ import annotations

import json
from pathlib import Path

from chorus.bench.figures import new_figure, require_matplotlib


def read_report(path: str | Path) -> dict:
    """A report's JSON object; ``ValueError`` naming the file when it is none."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path} is not a bench report (its JSON is not an object)")
    return report


def _levels(path: str | Path, report: dict, key: str, fields: tuple[str, ...], bench: str) -> list[dict]:
    """``report[key]``: a non-empty list of levels that each hold ``fields``, else ``ValueError``
    naming the file, the bench it is not a report of and what it lacks."""
    levels = report.get(key)
    if not isinstance(levels, list) or not levels or not all(
            isinstance(level, dict) and all(field in level for field in fields) for level in levels):
        raise ValueError(f"{path} is not a `chorus bench {bench}` report (it has no {key!r} list whose items "
                         f"all hold {' and '.join(repr(field) for field in fields)})")
    return levels


def stream_levels(path: str | Path) -> tuple[str, str, list[dict]]:
    """A ``chorus bench stream`` report's line label, card and levels; ``ValueError`` naming the
    file when it is not such a report."""
    report = read_report(path)
    levels = _levels(path, report, "stream", ("concurrency", "ttfa_s"), "stream")
    label = f"{report.get('variant', '?')} ({report.get('dtype', '?')}, {report.get('flow_steps', '?')} flow steps)"
    return label, report.get("device_name") or "?", levels


def online_levels(path: str | Path) -> tuple[str, list[dict]]:
    """A ``chorus bench online`` report's line label and levels; ``ValueError`` naming the file when
    it is not such a report. The label is the model, the card and the day the run started (from the
    report's provenance); a report that predates provenance is named by its file instead."""
    report = read_report(path)
    levels = _levels(path, report, "levels", ("concurrency", "throughput_audio_s_per_s"), "online")
    provenance = report.get("provenance")
    card = provenance.get("card") if isinstance(provenance, dict) else None
    where = f"{card}, {str(report.get('started_at') or '?')[:10]}" if card else Path(path).name
    return f"{report.get('model') or '?'}, {where}", levels


def plot_ttfa(out: str | Path, reports: list[str | Path]):
    """Draw the reports' time to first audio (p50 and p99) against concurrency into ``out`` (PNG)."""
    lines = [stream_levels(path) for path in reports]  # every file checked before drawing
    figure = new_figure(7, 4.5)
    axes = figure.add_subplot()
    for label, _, levels in lines:
        x = [level["concurrency"] for level in levels]
        line, = axes.plot(x, [level["ttfa_s"]["p50"] * 1000 for level in levels], "o-", label=f"{label} p50")
        axes.plot(x, [level["ttfa_s"]["p99"] * 1000 for level in levels], "s--", color=line.get_color(),
                  label=f"{label} p99")
    _concurrency_axis(axes, [level["concurrency"] for _, _, levels in lines for level in levels], "concurrent streams")
    axes.set_yscale("log")
    axes.set_ylabel("time to first audio (ms)")
    cards = sorted({card for _, card, _ in lines})
    axes.set_title(f"chorus bench stream on {', '.join(cards)} (random weights)")
    return _save(figure, axes, out)


def plot_throughput(out: str | Path, reports: list[str | Path]):
    """Draw the reports' delivered audio seconds per second against clients into ``out`` (PNG)."""
    lines = [online_levels(path) for path in reports]  # every file checked before drawing
    figure = new_figure(7, 4.5)
    axes = figure.add_subplot()
    for label, levels in lines:
        axes.plot([level["concurrency"] for level in levels],
                  [level["throughput_audio_s_per_s"] for level in levels], "o-", label=label)
    _concurrency_axis(axes, [level["concurrency"] for _, levels in lines for level in levels], "clients (closed loop)")
    axes.set_ylim(bottom=0)
    axes.set_ylabel("audio seconds delivered per second")
    axes.set_title("chorus bench online: throughput against clients (random weights)")
    return _save(figure, axes, out)


def plot_roofline(out: str | Path, report_path: str | Path, index: int = 0):
    """Redraw the roofline of the ``index``-th pass (``bench vocoder``) or decode step (``bench
    t3``) of a ``--roofline`` report into ``out`` (PNG), with the run's own title."""
    report = read_report(report_path)
    has_roofline = any(isinstance(entry, dict) and isinstance(entry.get("roofline"), dict)
                       for key in ("passes", "decode") for entry in report.get(key) or ())
    if not has_roofline or not isinstance(report.get("roof"), dict):
        raise ValueError(f"{report_path} is not a `chorus bench vocoder --roofline` or `chorus bench t3 --roofline` "
                         f"report (it has no passes or decode steps with a 'roofline', or no 'roof')")
    require_matplotlib()  # before torch loads with the roofline module
    from chorus.bench.roofline import roofline_entries, write_plot

    entries = roofline_entries(report)
    if not 0 <= index < len(entries):
        shown = ", ".join(f"{i}: {suffix}" for i, (_, suffix, _) in enumerate(entries))
        raise ValueError(f"--pass {index}: {report_path} holds {len(entries)} with a roofline, numbered from 0 "
                         f"({shown})")
    entry, _, title = entries[index]
    return write_plot(out, entry["roofline"], report["roof"], title)


def _concurrency_axis(axes, levels: list[int], label: str) -> None:
    """A log2 x axis with a plainly numbered tick at each level drawn."""
    axes.set_xscale("log", base=2)
    ticks = sorted(set(levels))
    axes.set_xticks(ticks, [str(tick) for tick in ticks])
    axes.set_xticks([], minor=True)
    axes.set_xlabel(label)


def _save(figure, axes, out: str | Path):
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(str(out), format="png", dpi=120)
    return figure
