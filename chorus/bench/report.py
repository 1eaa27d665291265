"""How every ``chorus bench`` command hands its report over: a table for people on stderr, the
JSON on stdout, and with ``--out`` the same JSON written atomically (never half a file).

Every report carries ``provenance``, what a reader needs to trust or re-run it: the git commit of
the code that ran (and whether its tree had changes), the card it ran on, the full command line,
and the bench's own version beside Chorus's. A report bound for ``benchmarks/results/`` must come
from committed code: :func:`check_results_tree` refuses a tree with changes unless told otherwise.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from chorus import __version__
from chorus.atomic import atomic_write_text

# Raised whenever what a bench measures, or what a field of its report means, changes, so that
# results of different versions are not compared as if alike.
BENCH_VERSION = 1
RESULTS_DIR = Path("benchmarks", "results")  # where the project's published results live
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the chorus package
_cli_argv: list[str] | None = None  # the arguments ``chorus`` ran with (see :func:`command_line`)


def write_report(report: dict, out: str | None, table: str | None = None) -> None:
    """Add ``report["provenance"]`` (the card: the report's own ``device_name`` where it ran a
    model, else :func:`local_card`), then print ``table`` to stderr and the JSON to stdout, and
    write it to ``out``."""
    report["provenance"] = provenance(report.get("device_name"))
    if table:
        print(table, file=sys.stderr)
    text = json.dumps(report, indent=2)
    if out:
        atomic_write_text(out, text + "\n")
    print(text)


def provenance(card: str | None = None) -> dict:
    """What produced a report: the commit of the code that ran and whether its tree had changes
    (None, None outside a git checkout), the card, the command line and the versions."""
    commit, changes = _git_state(SOURCE_ROOT, whole_checkout=True)
    return {"git_commit": commit, "git_dirty": None if changes is None else bool(changes),
            "card": card or local_card(), "command": command_line(),
            "bench_version": BENCH_VERSION, "chorus_version": __version__}


def set_cli_argv(argv: Sequence[str] | None) -> None:
    """Set by ``chorus``'s main to its arguments while a bench runs (None after it), since they are
    this process's own only when it was started as ``chorus``: main may run in-process."""
    global _cli_argv
    _cli_argv = None if argv is None else list(argv)


def command_line() -> str:
    """The command that made the report, as a shell would take it: ``chorus ARGS`` for the
    command line, else this process's program name and arguments (a script)."""
    if _cli_argv is not None:
        return shlex.join(["chorus", *_cli_argv])
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return shlex.join([program, *sys.argv[1:]])


def local_card() -> str:
    """This machine's GPUs as ``nvidia-smi`` names them (``2x NAME`` for two alike), or ``cpu``
    without one. For the client benches (online, swap) that is the server's card only when they
    run beside the server, as ``scripts/gpu/`` runs them."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    names = [n.strip() for n in names if n.strip()]
    if not names:
        return "cpu"
    if len(set(names)) == 1:
        return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"
    return ", ".join(names)


def check_results_tree(out: str, allow_dirty: bool = False) -> None:
    """Refuse (ValueError, one line) to write ``out`` into the ``benchmarks/results/`` directory
    of a git checkout that has changes: such a result could not be traced to a commit. New
    untracked files in that directory (the results of earlier runs) do not count."""
    directory = Path(out).expanduser().resolve().parent
    if allow_dirty or directory.parts[-2:] != RESULTS_DIR.parts:
        return
    _, changes = _git_state(directory, whole_checkout=False)
    if changes:
        more = f" and {len(changes) - 1} more" if len(changes) > 1 else ""
        raise ValueError(f"--out {out}: {RESULTS_DIR}/ takes results of committed code only, and the checkout "
                         f"has uncommitted changes ({changes[0]}{more}); commit them first, or pass --allow-dirty")


def _git_state(directory: Path, *, whole_checkout: bool) -> tuple[str | None, list[str] | None]:
    """(HEAD's commit, the changed paths) of the git checkout holding ``directory``; (None, None)
    when there is none (or git is missing), or with ``whole_checkout`` when ``directory`` is not
    the checkout's top (an installed package inside some other repository). Untracked files under
    ``benchmarks/results/`` are not changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, check=True,
                              timeout=60).stdout

    try:
        top = Path(git("rev-parse", "--show-toplevel").strip())
        if whole_checkout and top.resolve() != directory.resolve():
            return None, None
        commit = git("rev-parse", "HEAD").strip()
        lines = git("-c", "core.quotePath=false", "status", "--porcelain", "--untracked-files=all").splitlines()
    except (OSError, subprocess.SubprocessError):
        return None, None
    results = f"{RESULTS_DIR.as_posix()}/"
    return commit, [line[3:] for line in lines if not (line.startswith("??") and line[3:].startswith(results))]
