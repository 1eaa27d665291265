"""Random-weight checkpoints shared by the synthesis, voice and CLI tests."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from chorus.models.random_checkpoint import write_random_checkpoint
from chorus.models.variants import get_variant

_SHARED: dict[str, Path] = {}
BASE: list[Path] = []  # pytest's session temp dir, set by tests/conftest.py
BASE_ENV = "CHORUS_TEST_TMP"  # the same, for processes the tests start (Ray replicas, the CLI)
_MADE: list[str] = []  # every shared directory this process made (removed by remove_shared)


def scratch_dir(prefix: str) -> str:
    """A new directory for files shared by many tests, under pytest's base temp dir (in this
    process or a child of it), never in the system's temp dir; removed by :func:`remove_shared`
    (the session's end) or at exit."""
    base = BASE[0] if BASE else os.environ.get(BASE_ENV)
    if base is None:
        raise RuntimeError(f"no test temp dir: run under pytest (tests/conftest.py sets {BASE_ENV})")
    directory = tempfile.mkdtemp(prefix=prefix, dir=base)
    _MADE.append(directory)
    atexit.register(shutil.rmtree, directory, True)
    return directory


def remove_shared() -> None:
    """Remove every shared directory made so far (and forget the cached ones)."""
    from tests.pipeline import tiny_pipeline

    for directory in _MADE:
        shutil.rmtree(directory, ignore_errors=True)
    _MADE.clear()
    _SHARED.clear()
    tiny_pipeline.forget_checkpoints()


def shared_checkpoint(variant_name: str) -> Path:
    """A full random-weight checkpoint of ``variant_name``, written once per test session into a
    temporary directory under pytest's base temp dir, removed at the session's end: about 2 GB
    and 10 s for Nano."""
    if variant_name not in _SHARED:
        directory = scratch_dir(f"chorus-test-{variant_name}-")
        write_random_checkpoint(get_variant(variant_name), directory)
        _SHARED[variant_name] = Path(directory)
    return _SHARED[variant_name]


def light_checkpoint(variant_name: str, directory) -> str:
    """Tokenizer files and the built-in voice plus empty stand-ins for the weights: enough for
    everything the CLI checks before it loads models (loading any weight from it would fail)."""
    variant = get_variant(variant_name)
    write_random_checkpoint(variant, directory, components=("tokenizer", "conds"))
    for name in (variant.files.voice_encoder, variant.files.t3, variant.files.s3gen):
        (directory / name).touch()
    return str(directory)
