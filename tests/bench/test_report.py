"""Every bench report says what produced it, and benchmarks/results/ takes reports of committed
code only (chorus/bench/report.py)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from chorus import __version__
from chorus.bench import report
from chorus.bench.report import BENCH_VERSION, check_results_tree, write_report
from chorus.cli import build_parser, main


def _git(directory, *args: str) -> str:
    return subprocess.run(["git", "-C", str(directory), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with one committed file and an empty benchmarks/results/."""
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", "code.py")
    _git(root, "-c", "commit.gpgsign=false", "commit", "-q", "-m", "first")
    return root


def test_a_report_records_commit_card_command_and_versions(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["scripts/measure.py", "--out", "a b.json"])
    out = tmp_path / "r.json"
    write_report({"device_name": "NVIDIA H100 80GB HBM3", "x": 1}, str(out))
    written = json.loads(out.read_text())
    assert written == json.loads(capsys.readouterr().out)
    provenance = written["provenance"]
    assert provenance["card"] == "NVIDIA H100 80GB HBM3"  # the card the bench ran its model on
    assert provenance["command"] == "measure.py --out 'a b.json'"
    assert provenance["bench_version"] == BENCH_VERSION and provenance["chorus_version"] == __version__
    assert set(provenance) == {"git_commit", "git_dirty", "card", "command", "bench_version", "chorus_version"}


def test_the_commit_is_the_source_checkout_s_and_its_changes_are_told(checkout, monkeypatch):
    monkeypatch.setattr(report, "SOURCE_ROOT", checkout)  # the code's checkout, as if it ran from there
    head = _git(checkout, "rev-parse", "HEAD")
    assert report.provenance()["git_commit"] == head and report.provenance()["git_dirty"] is False
    (checkout / "code.py").write_text("x = 2\n")
    assert report.provenance()["git_dirty"] is True


def test_a_package_inside_another_checkout_has_no_commit(checkout, monkeypatch):
    # an installed chorus in a virtual environment inside some repository: not that repository's commit
    (checkout / "venv" / "site-packages").mkdir(parents=True)
    monkeypatch.setattr(report, "SOURCE_ROOT", checkout / "venv" / "site-packages")
    assert (report.provenance()["git_commit"], report.provenance()["git_dirty"]) == (None, None)


def test_a_report_without_a_device_names_this_machine_s_card(tmp_path):
    out = tmp_path / "r.json"
    write_report({"levels": []}, str(out))
    assert json.loads(out.read_text())["provenance"]["card"] == report.local_card()


def test_results_of_a_checkout_with_changes_are_refused(checkout):
    (checkout / "code.py").write_text("x = 2\n")
    with pytest.raises(ValueError) as refused:
        check_results_tree(str(checkout / "benchmarks" / "results" / "run.json"))
    message = str(refused.value)
    assert "\n" not in message and "uncommitted changes (code.py)" in message and "--allow-dirty" in message


def test_an_untracked_file_outside_the_results_is_a_change(checkout):
    (checkout / "new_module.py").write_text("y = 1\n")
    with pytest.raises(ValueError, match="new_module.py"):
        check_results_tree(str(checkout / "benchmarks" / "results" / "run.json"))


def test_earlier_uncommitted_results_are_not_a_change(checkout):
    (checkout / "benchmarks" / "results" / "earlier.json").write_text("{}\n")
    check_results_tree(str(checkout / "benchmarks" / "results" / "run.json"))


def test_allow_dirty_and_other_directories_are_not_checked(checkout):
    (checkout / "code.py").write_text("x = 2\n")
    check_results_tree(str(checkout / "benchmarks" / "results" / "run.json"), allow_dirty=True)
    check_results_tree(str(checkout / "run.json"))


def test_the_bench_refuses_before_it_runs(checkout, capsys):
    (checkout / "code.py").write_text("x = 2\n")
    out = checkout / "benchmarks" / "results" / "run.json"
    # an unreachable server would be an error of its own: the refusal comes first
    assert main(["bench", "online", "--url", "http://127.0.0.1:1", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"chorus: error: --out {out}: benchmarks/results/ takes results of committed code only")
    assert "\n" not in err and not out.exists()
    assert main(["bench", "online", "--url", "http://127.0.0.1:1", "--quiet", "--out", str(out),
                 "--allow-dirty"]) == 2
    assert "cannot reach the server" in capsys.readouterr().err  # allowed: it went on to run


def test_every_bench_takes_out_and_allow_dirty():
    bench = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    stages = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices
    # `bench plot` and `bench index` read reports already written: they run nothing and write no report
    missing = [name for name, parser in stages.items() if name not in ("plot", "index")
               and not {"out", "allow_dirty"} <= {a.dest for a in parser._actions}]
    assert stages and missing == []
