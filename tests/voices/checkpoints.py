"""Random-weight checkpoints shared by the synthesis, voice and CLI tests."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from chorus.models.random_checkpoint import write_random_checkpoint
from chorus.models.variants import get_variant

_SHARED: dict[str, Path] = {}
BASE: list[Path] = []  # pytest's session temp dir, set by tests/conftest.py


def shared_checkpoint(variant_name: str) -> Path:
    """A full random-weight checkpoint of ``variant_name``, written once per test session into a
    temporary directory (removed at exit, and under pytest's base temp dir, which pytest prunes
    even after a killed run): about 2 GB and 10 s for Nano."""
    if variant_name not in _SHARED:
        directory = tempfile.mkdtemp(prefix=f"chorus-test-{variant_name}-", dir=BASE[0] if BASE else None)
        atexit.register(shutil.rmtree, directory, True)
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
