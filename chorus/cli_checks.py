"""Checks the command line runs before any model loads: input files exist, output paths can be
written, and defaults that depend on the checkpoint. Each raises :class:`PathCheckError` (a
``ValueError``, shown as one line by ``chorus``) so a mistake costs seconds, not a synthesis."""
from __future__ import annotations

import os
from pathlib import Path

RANDOM_WEIGHTS_TOKEN_CAP = 100  # 4 s of speech per chunk


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


def random_weights_token_cap(has_random_weights: bool, max_new_tokens: int | None,
                             min_new_tokens: int | None) -> tuple[int | None, str | None]:
    """``(max_new_tokens, note)``: a random-weight model rarely samples EOS, so without an explicit
    ``--max-new-tokens`` every chunk would run to the variant's limit (about 1000 tokens, minutes
    on a CPU, 40 s of noise). Such checkpoints get a cap of :data:`RANDOM_WEIGHTS_TOKEN_CAP`
    tokens per chunk and a note saying so; everything else is returned unchanged."""
    if not has_random_weights or max_new_tokens is not None:
        return max_new_tokens, None
    cap = max(RANDOM_WEIGHTS_TOKEN_CAP, min_new_tokens or 0)
    return cap, (f"random-weight checkpoint: speech tokens capped at {cap} per chunk ({cap / 25:g} s); "
                 f"pass --max-new-tokens to change")
