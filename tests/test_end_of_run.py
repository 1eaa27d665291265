"""The end-of-run check of tests/conftest.py: a run that leaves a thread of its own running fails,
others are listed, and a Ray driver in the Ray tests' child process leaves no native thread, in a
real pytest run (a subprocess over a test file) that uses the suite's hooks."""
from __future__ import annotations

import os
import subprocess
import importlib.util
import sys
import tempfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path, test_file: str, **env) -> subprocess.CompletedProcess:
    """pytest over ``test_file`` (its text) with the suite's end-of-run hooks; ``env``: more
    environment for it."""
    hooks = "from tests.conftest import pytest_sessionfinish, pytest_unconfigure  # noqa: F401\n"
    (tmp_path / "conftest.py").write_text(hooks)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(test_file))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "inner"), "test_inner.py"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT, **env}, capture_output=True, text=True,
                          timeout=100)


def _run_leaving(tmp_path, thread: str) -> subprocess.CompletedProcess:
    """pytest over one passing test that starts ``thread`` (a ``threading.Thread(...)`` expression
    waiting on ``stop``) and leaves it running."""
    return _run(tmp_path, f"""\
        import threading

        stop = threading.Event()


        def test_passes_and_leaves_a_thread():
            {thread}.start()
        """)


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


def test_a_thread_named_by_its_native_library_is_listed_without_failing_the_run(tmp_path):
    run = _run(tmp_path, """\
        import ctypes
        import threading

        named, stop = threading.Event(), threading.Event()


        def name_and_wait():
            ctypes.CDLL(None).prctl(15, b"native-worker")  # PR_SET_NAME, as native code names its threads
            named.set()
            stop.wait()


        def test_passes_and_leaves_a_named_thread():
            threading.Thread(target=name_and_wait, daemon=True).start()
            assert named.wait(30)
        """)
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "named native threads ['native-worker']" in run.stdout


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'chorus[ray]')")
def test_a_ray_driver_in_the_ray_tests_child_process_leaves_no_native_thread_behind(tmp_path):
    # a daemon thread left running makes the end-of-run line appear, so that "none" is read, not assumed
    ray_test = """\
        import contextlib
        import threading

        from tests.server.ray_child import Child

        stop = threading.Event()


        @contextlib.contextmanager
        def ray_driver():
            import ray

            ray.init(num_cpus=1, object_store_memory=128 << 20, include_dashboard=False, configure_logging=False,
                     log_to_driver=False)
            try:
                yield ray
            finally:
                ray.shutdown()


        def resources(ray):
            return ray.cluster_resources()


        def test_ray_runs_in_the_child():
            with Child(ray_driver, timeout_s=80) as child:
                assert child.run(resources, timeout_s=30)["CPU"] == 1
            threading.Thread(target=stop.wait, name="a-library-thread", daemon=True).start()
        """
    # Ray's session folder goes in a short temp dir, in the run's (tests/run_temp_dir.py): its
    # socket paths are limited to 107 bytes
    with tempfile.TemporaryDirectory(prefix="ray-", dir=tempfile.gettempdir()) as temp:
        run = _run(tmp_path, ray_test, TMPDIR=temp)
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "Python daemon threads ['a-library-thread (daemon)']; named native threads none" in run.stdout
