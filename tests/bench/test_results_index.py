"""benchmarks/results/ keeps the reports behind published figures and decisions, and its index says
which: the index is current, every cited report exists, every report is cited, and every figure of
a figure table (docs/benchmarks.md, README.md) is the value its report holds."""
from __future__ import annotations

import json
import re
from pathlib import Path

from chorus.bench import results_index
from chorus.bench.results_index import RESULTS_DIR, citations, expand, figure_problem, figures, problems, render

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / RESULTS_DIR


def test_the_index_is_current():
    assert (RESULTS / "INDEX.md").read_text(encoding="utf-8") == render(ROOT), \
        "run: python -m chorus.bench.results_index"


def test_every_cited_result_file_exists():
    missing = [f"{c.doc}:{c.line} {c.name}" for c in citations(ROOT) if not results_index._matches(c.name, RESULTS)]
    assert not missing


def test_every_result_file_is_cited():
    cited = {name for c in citations(ROOT) for name in results_index._matches(c.name, RESULTS)}
    assert sorted(p.name for p in RESULTS.glob("*.json") if p.name not in cited) == []


def test_every_figure_is_what_its_result_file_holds():
    found = figures(ROOT)
    assert len(found) > 100 and {f.doc for f in found} == {"docs/benchmarks.md", "README.md"}
    assert [problem for f in found if (problem := figure_problem(f, RESULTS))] == []


def test_the_readme_figures_are_benchmarks_page_figures():
    """The README's Speed table repeats current figures: the same report, key and printed number."""
    page = {(f.file, f.key): f.printed for f in figures(ROOT) if f.doc == "docs/benchmarks.md"}
    readme = [f for f in figures(ROOT) if f.doc == "README.md"]
    assert readme and [f for f in readme if page.get((f.file, f.key)) != f.printed] == []


def _repo(tmp_path: Path, row: str, report: dict, index: bool = True) -> Path:
    """A repository of one figure table, one report and (unless told) its generated index."""
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / RESULTS_DIR).mkdir(parents=True)
    (tmp_path / "README.md").write_text("# Demo\n", encoding="utf-8")
    (tmp_path / "docs" / "benchmarks.md").write_text(
        "# Benchmarks\n\n## Streams\n\n| streams | 1 | 64 | source |\n|---|---|---|---|\n" + row + "\n",
        encoding="utf-8")
    (tmp_path / RESULTS_DIR / "stream-h100-2026-12-05-turbo.json").write_text(json.dumps(report), encoding="utf-8")
    if index:
        (tmp_path / RESULTS_DIR / "INDEX.md").write_text(render(tmp_path), encoding="utf-8")
    return tmp_path


REPORT = {"stream": [{"concurrency": 1, "ttfa_s": {"p99": 0.0529}}, {"concurrency": 64, "ttfa_s": {"p99": 0.2924}}]}
SOURCE = "`stream-h100-2026-12-05-turbo.json` `stream[concurrency={}].ttfa_s.p99*1000`"


def test_a_table_that_matches_its_report_has_no_problem(tmp_path):
    assert problems(_repo(tmp_path, f"| TTFA p99 (ms) | 53 | 292 | {SOURCE} |", REPORT)) == []


def test_a_figure_that_differs_from_its_report_is_named_with_both_numbers(tmp_path):
    found = problems(_repo(tmp_path, f"| TTFA p99 (ms) | 53 | 290 | {SOURCE} |", REPORT))
    assert found == ["docs/benchmarks.md:7 (TTFA p99 (ms), 64): printed 290, but stream-h100-2026-12-05-turbo.json "
                     "`stream[concurrency=64].ttfa_s.p99*1000` is 292.4"]


def test_a_figure_is_compared_at_the_precision_it_is_printed_with(tmp_path):
    assert problems(_repo(tmp_path, f"| TTFA p99 (ms) | 52.9 | 292.4 | {SOURCE} |", REPORT)) == []
    assert problems(_repo(tmp_path / "b", f"| TTFA p99 (ms) | 52.9 | 292.5 | {SOURCE} |", REPORT)) != []


def test_a_key_path_the_report_lacks_is_a_problem(tmp_path):
    row = "| TTFA p99 (ms) | 53 | - | `stream-h100-2026-12-05-turbo.json` `stream[concurrency={}].ttfa.p99` |"
    assert problems(_repo(tmp_path, row, REPORT)) == [
        "docs/benchmarks.md:7 (TTFA p99 (ms), 1): stream-h100-2026-12-05-turbo.json "
        "`stream[concurrency=1].ttfa.p99`: no key 'ttfa'"]


def test_a_report_nothing_cites_is_a_problem(tmp_path):
    repo = _repo(tmp_path, "| TTFA p99 (ms) | - | - | - |", REPORT)
    (repo / "docs" / "benchmarks.md").write_text("# Benchmarks\n", encoding="utf-8")
    (repo / RESULTS_DIR / "INDEX.md").write_text(render(repo), encoding="utf-8")
    assert problems(repo) == [f"{RESULTS_DIR.as_posix()}/stream-h100-2026-12-05-turbo.json: cited by no document "
                              "(cite it or git rm it)"]


def test_a_cited_report_that_does_not_exist_is_a_problem(tmp_path):
    repo = _repo(tmp_path, f"| TTFA p99 (ms) | 53 | 292 | {SOURCE} |", REPORT)
    (repo / "README.md").write_text("Figures: `benchmarks/results/stream-h200-2026-12-05-turbo.json`.\n",
                                    encoding="utf-8")
    (repo / RESULTS_DIR / "INDEX.md").write_text(render(repo), encoding="utf-8")
    assert problems(repo) == ["README.md:1: cites stream-h200-2026-12-05-turbo.json, which is not in "
                              f"{RESULTS_DIR.as_posix()}/"]


def test_a_stale_index_is_a_problem(tmp_path):
    repo = _repo(tmp_path, f"| TTFA p99 (ms) | 53 | 292 | {SOURCE} |", REPORT, index=False)
    assert problems(repo) == [f"{RESULTS_DIR.as_posix()}/INDEX.md is out of date: "
                              "run python -m chorus.bench.results_index"]


def test_the_command_writes_the_index_that_check_accepts(tmp_path, capsys):
    repo = _repo(tmp_path, f"| TTFA p99 (ms) | 53 | 292 | {SOURCE} |", REPORT, index=False)
    assert results_index.main(["--root", str(repo)]) == 0
    assert results_index.main(["--root", str(repo), "--check"]) == 0
    assert "stream-h100-2026-12-05-turbo.json` | 2 | docs/benchmarks.md (Streams)" in \
        (repo / RESULTS_DIR / "INDEX.md").read_text(encoding="utf-8")


def test_a_table_of_current_figures_without_a_source_column_is_a_problem(tmp_path):
    repo = _repo(tmp_path, f"| TTFA p99 (ms) | 53 | 292 | {SOURCE} |", REPORT)
    page = repo / "docs" / "benchmarks.md"
    page.write_text("# Benchmarks\n\n## Current figures\n\n| streams | 64 |\n|---|---|\n| TTFA p99 (ms) | 292 |\n\n"
                    + page.read_text(encoding="utf-8").split("\n", 1)[1], encoding="utf-8")
    (repo / RESULTS_DIR / "INDEX.md").write_text(render(repo), encoding="utf-8")
    assert problems(repo) == ['docs/benchmarks.md:5: a table of "Current figures" without a source column']


def test_braces_in_a_citation_expand_as_in_a_shell():
    assert expand("h200-{offline,stream}-turbo-{off,on}.json") == [
        "h200-offline-turbo-off.json", "h200-offline-turbo-on.json",
        "h200-stream-turbo-off.json", "h200-stream-turbo-on.json"]


def test_a_quoted_key_reads_a_dict_key_that_holds_dots():
    report = {"roofline": {"classes": {"hift.conv": {"roof_fraction": 0.14}}}}
    assert results_index.resolve(report, 'roofline.classes["hift.conv"].roof_fraction') == 0.14
    try:
        results_index.resolve(report, 'roofline.classes["hift.istft"].roof_fraction')
    except KeyError as error:
        assert "hift.istft" in str(error)
    else:
        raise AssertionError("a missing quoted key must be a KeyError")


def test_no_committed_report_names_an_absolute_path_of_the_machine_it_ran_on():
    """A report's command is kept as run; its --out must name the committed file, not where the
    run's machine wrote it."""
    for path in sorted(RESULTS.glob("*.json")):
        command = (json.loads(path.read_text()).get("provenance") or {}).get("command") or ""
        assert not re.search(r"(^|\s)/(root|home|work)/", command), f"{path.name}: {command}"
