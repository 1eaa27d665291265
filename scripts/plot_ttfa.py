#!/usr/bin/env python
"""Plot time to first audio against concurrency from ``chorus bench stream`` JSON reports.

    python scripts/plot_ttfa.py OUT.png REPORT.json [REPORT.json ...]     (needs matplotlib)

One line per report for the median and one (dashed) for p99, on log-log axes.
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, reports = argv[0], argv[1:]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path in reports:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        levels = report["stream"]
        x = [level["concurrency"] for level in levels]
        label = f"{report['variant']} ({report['dtype']}, {report['flow_steps']} flow steps)"
        line, = ax.plot(x, [level["ttfa_s"]["p50"] * 1000 for level in levels], "o-", label=f"{label} p50")
        ax.plot(x, [level["ttfa_s"]["p99"] * 1000 for level in levels], "s--", color=line.get_color(),
                label=f"{label} p99")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("time to first audio (ms)")
    ax.set_title(f"chorus bench stream on {report['device_name']} (random weights)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
