"""Writing files and directories atomically.

Every file or directory a command produces is first written under a temporary name in the same
directory (``.NAME.tmp-XXXX``, hidden) and renamed into place only when complete, so an
interrupted or failed run leaves either the previous output or nothing: never something that
looks like output but is cut short. The temporary is removed on every exit path, Ctrl-C included.

Tests of that last promise need a crash or a signal to arrive while a write is under way,
whatever the machine's speed: with ``CHORUS_TEST_HOLD_WRITES=FILE`` in the environment (a
test-only switch, unset in normal use), a write that reaches a hold point (:func:`hold_for_tests`:
:func:`atomic_directory` before its rename, the voice store's writes and deletes) writes the
point's name to FILE and waits there until a signal interrupts it or the process is killed.
``CHORUS_TEST_HOLD_POINT=NAME`` limits the hold to one point, and ``CHORUS_TEST_HOLD_AFTER=N``
lets the first N arrivals at it pass (e.g. N uploads finish, the next one is held mid-way).
"""
from __future__ import annotations

import itertools
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TEMP_MARK = ".tmp-"
HOLD_WRITES_ENV = "CHORUS_TEST_HOLD_WRITES"  # test-only: see the module docstring
HOLD_POINT_ENV = "CHORUS_TEST_HOLD_POINT"
HOLD_AFTER_ENV = "CHORUS_TEST_HOLD_AFTER"
_hold_arrivals = itertools.count()  # arrivals at a hold point that holds (tests only)


def temporary_sibling(path: str | os.PathLike) -> Path:
    """A fresh hidden name next to ``path`` (same directory, so a rename is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, on any exception
    (KeyboardInterrupt included) it is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def atomic_directory(path: str | os.PathLike, *, replaceable=lambda existing: False) -> Iterator[Path]:
    """Yield an empty temporary directory to fill; on success it becomes ``path``.

    ``path`` may be absent or an empty directory. An existing non-empty directory is replaced
    only when ``replaceable(path)`` says so (e.g. an earlier random checkpoint), else
    :class:`FileExistsError` is raised before anything is written. Parents are created.
    """
    path = Path(path)
    check_directory_target(path, replaceable)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    tmp.mkdir()
    old: Path | None = None
    try:
        yield tmp
        hold_for_tests("directory")
        if path.is_dir() and any(path.iterdir()):
            old = temporary_sibling(path)
            os.replace(path, old)
        os.replace(tmp, path)  # onto an absent or empty directory
    except BaseException:
        _remove(tmp)
        if old is not None and not path.exists():
            os.replace(old, path)
            old = None
        raise
    finally:
        if old is not None:
            _remove(old)


def hold_for_tests(point: str) -> None:
    """With ``CHORUS_TEST_HOLD_WRITES=FILE`` (tests only; see the module docstring): write
    ``point`` to FILE and wait until a signal (e.g. SIGINT -> KeyboardInterrupt in the main
    thread) or a kill ends the wait. Without it: nothing, at the cost of one lookup."""
    marker = os.environ.get(HOLD_WRITES_ENV)
    if not marker or os.environ.get(HOLD_POINT_ENV, point) != point:
        return
    if next(_hold_arrivals) < int(os.environ.get(HOLD_AFTER_ENV, "0")):  # count() is atomic under the GIL
        return
    atomic_write_text(marker, point + "\n")  # whole when it appears: the test reads it at once
    while True:
        time.sleep(3600)


def check_directory_target(path: str | os.PathLike, replaceable=lambda existing: False) -> None:
    """Raise unless ``path`` can become an output directory (see :func:`atomic_directory`)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not replaceable(path):
        raise FileExistsError(f"{path} exists and is not empty; choose a new directory")
