"""One temp folder per test run, so that a run leaves nothing in the system's temp dir.

``start()`` (tests/conftest.py, before any test) makes ``chorus-tests-XXXXXXXX`` in the system's
temp dir and makes it *the* temp dir of the run: ``tempfile`` here, ``TMPDIR`` for every process
the tests start. So pytest's base temp dir, Ray's session folders and the files of CLI and
server subprocesses all land in it. At the end of a passed run the folder is removed, after a
check that nothing but pytest's own base folder and torch's compile cache was left in it (a test
or fixture that leaves files fails the run, naming them). A failed run keeps the folder, with its failed tests'
``tmp_path`` directories, until the next run starts (as ``tmp_path_retention_count = 1``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

PREFIX = "chorus-tests-"
PID_FILE = "run.pid"  # the pid of the run that owns the folder
# what may stay in the folder until it is removed: pytest's per-user base folder (its numbered
# dirs are its own business), torch's compile cache (torch.compile in a replica or a test) and
# PulseAudio's runtime folder, which the browser tests' Chromium makes as it starts
KEPT_PREFIXES = ("pytest-of-", "torchinductor_", "pulse-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_finished_runs(system: Path) -> None:
    """Folders of earlier runs whose process has ended (kept because they failed)."""
    for folder in system.glob(f"{PREFIX}*"):
        try:
            pid = int((folder / PID_FILE).read_text())
        except (OSError, ValueError):
            continue  # not (yet) a run's folder: leave it
        if not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


def start() -> Path:
    """Make this run's temp folder and make it the temp dir of this process and its children."""
    system = Path(tempfile.gettempdir())
    _remove_finished_runs(system)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=system))  # short: Ray's socket paths live under it
    (folder / PID_FILE).write_text(str(os.getpid()))
    tempfile.tempdir = str(folder)
    os.environ["TMPDIR"] = str(folder)
    return folder


def leftovers(folder: Path) -> list[str]:
    """What the run left in its temp folder besides the pid file, pytest's base folder and caches."""
    return sorted(p.name for p in folder.iterdir() if p.name != PID_FILE and not p.name.startswith(KEPT_PREFIXES))


class Check:
    """At the session's end (after pytest removed its base temp dir): a passed run that left files
    in its temp folder fails; otherwise a passed run removes the folder."""

    def __init__(self, folder: Path, exit_status: list[int]):
        self.folder = folder
        self._exit_status = exit_status  # what tests/conftest.py exits with (its last entry)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session) -> None:
        if session.exitstatus != 0:
            _say(session, f"the temporary files of this run are kept in {self.folder}")
            return
        left = leftovers(self.folder)
        if left:
            _say(session, f"FAILED: the run left files in its temp dir {self.folder} (a test or fixture that does "
                          f"not remove what it made): {', '.join(left)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self._exit_status.append(int(session.exitstatus))
            return
        shutil.rmtree(self.folder, ignore_errors=True)


def _say(session, line: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
