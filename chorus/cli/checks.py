"""Checks the command line runs before any model loads: input files exist and output paths can
be written. Each raises :class:`PathCheckError` (a ``ValueError``, shown as one line by
``chorus``) so a mistake costs seconds, not a synthesis."""
from __future__ import annotations

import os
from pathlib import Path

class PathCheckError(ValueError):
    """An input or output path given on the command line cannot be used."""


def check_input_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` exists and is a readable file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PathCheckError(f"{option} {os.fspath(path)}: file not found")
    if not p.is_file():
        raise PathCheckError(f"{option} {os.fspath(path)} is not a file")
    if not os.access(p, os.R_OK):
        raise PathCheckError(f"{option} {os.fspath(path)} is not readable")
    return p


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` can be written: its directory exists and is writable, and it is not a directory."""
    p = Path(path).expanduser()
    parent = p.parent
    if p.is_dir():
        raise PathCheckError(f"{option} {os.fspath(path)} is a directory; give a file name")
    if not parent.is_dir():
        raise PathCheckError(f"{option} {os.fspath(path)}: the directory {os.fspath(parent)} does not exist; "
                             f"create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PathCheckError(f"{option} {os.fspath(path)}: the directory {os.fspath(parent)} is not writable")
    return p


def check_output_directory(path: str | os.PathLike, option: str, *, replaceable=lambda existing: False) -> Path:
    """``path`` can become a new directory: absent (its first existing ancestor writable), empty,
    or ``replaceable`` (e.g. an earlier random checkpoint)."""
    from chorus.atomic import check_directory_target

    p = Path(path).expanduser()
    try:
        check_directory_target(p, replaceable)
    except FileExistsError as exc:
        raise PathCheckError(f"{option}: {exc}") from None
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise PathCheckError(f"{option} {os.fspath(path)}: {os.fspath(ancestor)} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PathCheckError(f"{option} {os.fspath(path)}: the directory {os.fspath(ancestor)} is not writable")
    return p
