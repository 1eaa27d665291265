"""The end-of-run check of tests/conftest.py: a run that leaves a thread of its own running fails,
in a real pytest run (a subprocess over a test that starts one) that uses the suite's hooks."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.timeout(120)


def _run_leaving(tmp_path, thread: str) -> subprocess.CompletedProcess:
    """pytest over one passing test that starts ``thread`` (a ``threading.Thread(...)`` expression
    waiting on ``stop``) and leaves it running, with the suite's end-of-run hooks."""
    hooks = "from tests.conftest import pytest_sessionfinish, pytest_unconfigure  # noqa: F401\n"
    (tmp_path / "conftest.py").write_text(hooks)
    (tmp_path / "test_leaves_a_thread.py").write_text(textwrap.dedent(f"""\
        import threading

        stop = threading.Event()


        def test_passes_and_leaves_a_thread():
            {thread}.start()
        """))
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("CHORUS_TEST_NO_HARD_EXIT", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "inner"), "test_leaves_a_thread.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)


def test_a_daemon_thread_of_chorus_left_running_fails_the_run(tmp_path):
    run = _run_leaving(tmp_path, 'threading.Thread(target=stop.wait, name="chorus-t3-engine", daemon=True)')
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "threads the tests started are still running: chorus-t3-engine (daemon)" in run.stdout
    assert "1 passed" in run.stdout


def test_a_thread_that_is_not_a_daemon_fails_the_run_instead_of_hanging_its_exit(tmp_path):
    run = _run_leaving(tmp_path, 'threading.Thread(target=stop.wait, name="left-behind")')
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "left-behind (not a daemon)" in run.stdout


def test_a_library_daemon_thread_is_listed_without_failing_the_run(tmp_path):
    run = _run_leaving(tmp_path, 'threading.Thread(target=stop.wait, name="a-library-thread", daemon=True)')
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "Python daemon threads ['a-library-thread (daemon)']" in run.stdout
