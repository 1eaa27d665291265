"""The closing line of a test run: which tests were skipped, by kind, and how to include them.

pytest's own summary lists every skip with its reason (``-ra``, pyproject) in the middle of a long
output; this line comes last, after the totals, so that a run that skipped a whole kind of tests
(the browser tests without Chromium, the GPU tests without CUDA) says so where it is read.
Registered by tests/conftest.py.
"""
from __future__ import annotations

from collections import Counter

# marker -> (what they are, why they are skipped and how to include them, a word of that skip's
# reason); a skip of a marked test for another reason (a parity test of a variant without CFG)
# counts under "others"
KINDS = {
    "browser": ("browser tests", "no Chromium: apt-get install chromium, or CHORUS_CHROMIUM=PATH, includes them",
                "chromium"),
    "gpu": ("GPU tests", "no CUDA device: scripts/gpu/README.md runs them on one", "cuda"),
    "oracle": ("parity tests", "no reference oracle: bash scripts/install-test-env.sh installs it", "oracle"),
}


def _reason(report) -> str:
    longrepr = report.longrepr  # a skip's is (file, line, "Skipped: reason")
    return (longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)).lower()


class SkipSummary:
    def __init__(self):
        self.skipped: Counter[str | None] = Counter()

    def pytest_runtest_logreport(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = _reason(report)
            self.skipped[next((kind for kind, (_, _, word) in KINDS.items()
                               if kind in report.keywords and word in reason), None)] += 1

    def pytest_collectreport(self, report) -> None:
        if report.skipped:  # a whole module (e.g. an optional package missing)
            self.skipped[None] += 1

    def line(self) -> str:
        if not self.skipped:
            return "skipped: nothing"
        parts = [f"{self.skipped[kind]} {what} ({how})" for kind, (what, how, _) in KINDS.items()
                 if self.skipped[kind]]
        if self.skipped[None]:
            parts.append(f"{self.skipped[None]} others (the reasons are listed above, 'SKIPPED')")
        return "skipped: " + "; ".join(parts)

    def pytest_unconfigure(self, config) -> None:  # after pytest's totals (tests/conftest.py exits after this)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and (reporter.stats or self.skipped):
            reporter.write_line(self.line())
