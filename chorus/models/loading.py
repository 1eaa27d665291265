"""Finding and reading checkpoints in the official Chatterbox layout.

A checkpoint is a directory holding a variant's files under their official names (see
``Variant.files``). It comes from a local directory or from a Hugging Face hub repo id;
hub downloads go through ``huggingface_hub`` (cached, honouring ``HF_HUB_OFFLINE``,
``HF_TOKEN`` and ``HF_HOME``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from chorus.models.variants import Variant

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}


class CheckpointNotFoundError(FileNotFoundError):
    """A checkpoint directory or some of its files could not be found."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"fp32" | "bf16" | "fp16"`` (or a torch dtype) -> torch dtype."""
    if isinstance(name, torch.dtype):
        if name not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {name}; use fp32, bf16 or fp16")
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use fp32, bf16 or fp16") from None


def parse_device(name: str | torch.device | None) -> torch.device:
    """``"auto"`` (or None) picks CUDA when available, else CPU."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this machine")
    return device


def _looks_like_local_path(location: str) -> bool:
    # "owner/name" is a hub id; anything rooted, relative-marked or deeper is a path.
    return location.startswith(("/", ".", "~")) or location.count("/") != 1 or "\\" in location


def _missing_files_message(variant: Variant, where: str, missing: list[str]) -> str:
    return (
        f"the {variant.name} checkpoint at {where} lacks {len(missing)} required file(s): "
        f"{', '.join(missing)}.\nPoint Chorus at a local directory holding the official files "
        f"({', '.join(variant.files.required)}) with --checkpoint DIR, or make them reachable on "
        f"the hub (unset HF_HUB_OFFLINE, set HF_TOKEN for gated repos). "
        f"`chorus checkpoint random --variant {variant.name} --out DIR` writes a random-weight "
        f"directory for testing."
    )


def resolve_checkpoint_dir(variant: Variant, location: str | os.PathLike | None = None,
                           *, revision: str | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a local directory with every required file of ``variant``.

    ``location`` is a local directory, a hub repo id, or None for the variant's official repo.
    Optional files (``conds.pt``, the Chinese Cangjie table) are fetched when available.
    Raises :class:`CheckpointNotFoundError` naming every missing file.
    """
    location = variant.hub_repo if location is None else os.fspath(location)
    expanded = os.path.expanduser(location)
    if os.path.isdir(expanded):
        directory = Path(expanded)
        missing = [f for f in variant.files.required if not (directory / f).is_file()]
        if missing:
            raise CheckpointNotFoundError(_missing_files_message(variant, str(directory), missing))
        return directory
    if _looks_like_local_path(location):
        raise CheckpointNotFoundError(
            f"checkpoint directory {location!r} does not exist. Pass an existing directory in the "
            f"official layout or a hub repo id such as {variant.hub_repo!r}."
        )
    return _download_from_hub(variant, location, revision, cache_dir)


def _download_from_hub(variant: Variant, repo_id: str, revision: str | None,
                       cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    directory: Path | None = None
    missing: list[str] = []
    reasons: set[str] = set()
    for name in (*variant.files.required, variant.files.conds, *variant.files.optional):
        try:
            path = Path(hf_hub_download(repo_id, name, revision=revision, cache_dir=cache_dir))
            directory = directory or path.parent
        except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
            if name in variant.files.required:
                missing.append(name)
                reasons.add(type(exc).__name__)
    if missing:
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        where = f"hub repo {repo_id!r}" + (" (HF_HUB_OFFLINE is set: only the local cache was searched)" if offline else "")
        raise CheckpointNotFoundError(
            _missing_files_message(variant, where, missing) + f"\n(errors: {', '.join(sorted(reasons))})"
        )
    assert directory is not None
    return directory


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` or ``.pt`` state dict onto the CPU.

    T3 files may wrap the state dict as ``{"model": [state, ...]}`` (training checkpoints);
    that wrapper is unwrapped here.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint file {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"could not read checkpoint file {path}: {exc}") from exc
    if isinstance(state, Mapping) and "model" in state and not isinstance(state["model"], torch.Tensor):
        state = state["model"][0]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint file {path} does not hold a flat state dict of tensors")
    return dict(state)


@dataclass(frozen=True)
class Checkpoint:
    """A resolved checkpoint directory of one variant."""

    variant: Variant
    directory: Path

    @classmethod
    def open(cls, variant: Variant, location: str | os.PathLike | None = None,
             *, revision: str | None = None, cache_dir: str | os.PathLike | None = None) -> "Checkpoint":
        return cls(variant, resolve_checkpoint_dir(variant, location, revision=revision, cache_dir=cache_dir))

    def path(self, name: str) -> Path:
        return self.directory / name

    def t3_state(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.path(self.variant.files.t3))

    def voice_encoder_state(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.path(self.variant.files.voice_encoder))

    def s3gen_state(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.path(self.variant.files.s3gen))

    def has_builtin_voice(self) -> bool:
        return self.path(self.variant.files.conds).is_file()

    def builtin_voice_state(self) -> dict[str, Any]:
        """The raw ``conds.pt`` dict: ``{"t3": {...}, "gen": {...}}``."""
        path = self.path(self.variant.files.conds)
        if not path.is_file():
            raise CheckpointNotFoundError(
                f"{path} does not exist: this checkpoint has no built-in voice; pass a reference clip"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, Mapping) or "t3" not in state or "gen" not in state:
            raise ValueError(f"{path} is not a Chatterbox conditionals file (expected keys 't3' and 'gen')")
        return dict(state)


def load_t3(checkpoint: Checkpoint, *, dtype: str | torch.dtype = "fp32",
            device: str | torch.device | None = "cpu"):
    """Build the T3 model of ``checkpoint`` with its weights, converted once to ``dtype``."""
    from chorus.models.t3.model import T3Model

    return T3Model.from_state_dict(
        checkpoint.variant.t3, checkpoint.t3_state(), dtype=parse_dtype(dtype),
        device=parse_device(device), source=str(checkpoint.path(checkpoint.variant.files.t3)),
    )
