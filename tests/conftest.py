"""Shared test setup.

Parity tests import the reference package ``chatterbox`` (chatterbox-tts 0.1.7, a test-only
oracle, see docs/testing.md). Where it is not installed those tests are skipped, except when
``CHORUS_REQUIRE_ORACLE=1`` (set by CI), where a missing oracle is an error; the browser and the
agent frameworks have their own switches (``missing``).
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
# Without a GPU, Triton kernels that a test forces run under the Triton interpreter. This must be
# set before a kernel module is first imported: ``triton.jit`` reads it when it decorates.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(int(os.environ.get("CHORUS_TEST_THREADS", "2")))

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


def missing(switch: str, what: str) -> None:
    """Something a test needs and the environment may lack (``what``: it, and how to get it) is
    missing: skip the test (or the module), or fail where the environment variable ``switch`` is
    1. CI sets CHORUS_REQUIRE_ORACLE, CHORUS_REQUIRE_BROWSER and CHORUS_REQUIRE_FRAMEWORKS
    (``.ci/run --container`` CHORUS_REQUIRE_CONTAINER), so nothing it must test is skipped there."""
    if os.environ.get(switch) == "1":
        raise RuntimeError(f"{switch}=1 requires it: {what}")
    pytest.skip(what, allow_module_level=True)


def _import_oracle():
    try:
        import chatterbox  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the environment
        missing("CHORUS_REQUIRE_ORACLE", f"the reference oracle (chatterbox-tts) does not import: {exc}")
    return chatterbox


@pytest.fixture(scope="session", autouse=True)
def _shared_checkpoints_under_pytest_temp(tmp_path_factory):
    """Big shared checkpoints go under pytest's base temp dir (see pyproject's tmp_path_*), also
    those written by processes the tests start (Ray replicas, the CLI: BASE_ENV), and are
    removed when the session ends, whether or not a test failed."""
    from tests.voices import checkpoints

    base = tmp_path_factory.getbasetemp()
    checkpoints.BASE[:] = [base]
    os.environ[checkpoints.BASE_ENV] = str(base)
    yield
    checkpoints.remove_shared()
    checkpoints.BASE.clear()
    os.environ.pop(checkpoints.BASE_ENV, None)


class ScopedTempDirs:
    """``mktemp(name)`` as pytest's ``tmp_path_factory``, for module- and session-scoped
    fixtures: the directories are removed when the fixture's scope ends. pytest itself keeps
    them after a failed run (only a failed test's own ``tmp_path`` is worth keeping), and some
    hold gigabytes."""

    def __init__(self, factory):
        self._factory = factory
        self._paths: list = []

    def mktemp(self, name: str, numbered: bool = True):
        path = self._factory.mktemp(name, numbered=numbered)
        self._paths.append(path)
        return path

    def remove(self) -> None:
        for path in self._paths:
            shutil.rmtree(path, ignore_errors=True)
        self._paths.clear()


@pytest.fixture(scope="module")
def module_tmp_path_factory(tmp_path_factory):
    """Temporary directories for module-scoped fixtures, removed after the module."""
    dirs = ScopedTempDirs(tmp_path_factory)
    yield dirs
    dirs.remove()


@pytest.fixture(scope="session")
def session_tmp_path_factory(tmp_path_factory):
    """Temporary directories for session-scoped fixtures, removed at the end of the session."""
    dirs = ScopedTempDirs(tmp_path_factory)
    yield dirs
    dirs.remove()


@pytest.fixture(scope="session")
def oracle():
    """The imported reference package; skips (or fails under CI) when it is missing."""
    return _import_oracle()


def pytest_configure(config):
    from tests import run_temp_dir
    from tests.skip_summary import SkipSummary

    # the run's own temp dir, removed when it passes (here, not at import: other processes import
    # this module for DATA_DIR)
    folder = run_temp_dir.start()
    config.pluginmanager.register(run_temp_dir.Check(folder, _EXIT_STATUS), "chorus-run-temp-dir")
    config.pluginmanager.register(SkipSummary(), "chorus-skip-summary")  # the run's closing line


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# -- the end of the run ---------------------------------------------------------------------------
# Once every fixture is torn down, nothing the tests started may still run: a Python thread that is
# not a daemon, or a daemon thread of Chorus's own (an engine's, a vocoder's, a test server's;
# their names start with "chorus-"), fails the run. Other daemon threads, and native threads that
# their libraries named, are listed: none are expected. Ray, whose native threads outlive
# ray.shutdown(), runs its driver in a child process (tests/server/ray_child.py). A run that leaves
# a thread that is not a daemon ends with os._exit once pytest has written its reports: a normal
# exit would wait for that thread forever.
LEFTOVER_GRACE_S = 10.0  # for threads that were told to stop and are on their way out
_EXIT_STATUS: list[int] = []  # the run's exit status: its last entry (a hook that changes it appends)


def _native_threads() -> list[str]:
    """The names of this process's threads that a native library named (Python's threads, and
    unnamed native ones, keep the process's name)."""
    with open("/proc/self/comm") as comm:
        process = comm.read().strip()
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:  # the thread has ended
            pass
    return sorted(name for name in names if name != process)


def _leftover_threads() -> tuple[list[str], list[str]]:
    """(threads that fail the run, other daemon threads) still alive after the grace period."""
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    failing, other = [], []
    for thread in threading.enumerate():
        if thread is threading.main_thread():
            continue
        ours = not thread.daemon or thread.name.startswith("chorus-")
        if ours:
            thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            (failing if ours else other).append(f"{thread.name} ({'daemon' if thread.daemon else 'not a daemon'})")
    return failing, other


@pytest.hookimpl(trylast=True)  # after pytest's own sessionfinish has torn down every fixture
def pytest_sessionfinish(session, exitstatus):
    failing, other = _leftover_threads()
    native = _native_threads()
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and (other or native or failing):
        terminal.write("\n")  # after the progress line
    if terminal is not None and (other or native):
        terminal.write_line(f"still running at the end of the run: Python daemon threads {other or 'none'}; "
                            f"named native threads {native or 'none'}")
    if failing:
        if terminal is not None:
            terminal.write_line(f"FAILED: threads the tests started are still running: {', '.join(failing)} "
                                "(stop or join them)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _EXIT_STATUS.append(int(session.exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if any(thread.is_alive() and not thread.daemon for thread in threading.enumerate()
           if thread is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
