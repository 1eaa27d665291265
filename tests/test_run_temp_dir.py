"""A test run leaves nothing in the system's temp dir (tests/run_temp_dir.py): checked on small
pytest runs in a subprocess, each given a system temp dir of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(tmp_path: Path, test: str) -> tuple[subprocess.CompletedProcess, Path]:
    """pytest with this suite's conftest over one test file; returns the result and the system
    temp dir the run was given."""
    system = tmp_path / "system-tmp"
    system.mkdir()
    (tmp_path / "test_it.py").write_text(test)
    env = {**os.environ, "TMPDIR": str(system), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                             "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_it.py")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return result, system


def test_a_passed_run_removes_its_temp_dir_with_pytests_base_folder(tmp_path):
    result, system = run_pytest(tmp_path, "def test_writes(tmp_path):\n    (tmp_path / 'f').write_text('x')\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(system.iterdir()) == []


def test_a_run_that_leaves_a_file_in_the_temp_dir_fails_and_names_it(tmp_path):
    result, system = run_pytest(tmp_path, "import pathlib, tempfile\n\n"
                                    "def test_leaks():\n"
                                    "    pathlib.Path(tempfile.gettempdir(), 'left-behind.txt').write_text('x')\n")
    assert result.returncode == 1
    assert "the run left files in its temp dir" in result.stdout and "left-behind.txt" in result.stdout
    [kept] = system.iterdir()  # kept for a look, removed by the next run
    assert kept.name.startswith("chorus-tests-") and (kept / "left-behind.txt").is_file()


def test_child_processes_write_into_the_runs_temp_dir(tmp_path):
    result, system = run_pytest(tmp_path, "import os, subprocess, sys, tempfile\n\n"
                                    "def test_child():\n"
                                    "    out = subprocess.run([sys.executable, '-c', 'import tempfile; "
                                    "print(tempfile.gettempdir())'], capture_output=True, text=True).stdout\n"
                                    "    assert out.strip() == tempfile.gettempdir() == os.environ['TMPDIR']\n"
                                    "    assert os.path.basename(out.strip()).startswith('chorus-tests-')\n")
    assert result.returncode == 0, result.stdout + result.stderr
