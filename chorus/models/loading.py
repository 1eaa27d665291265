"""Finding and reading checkpoints in the official Chatterbox layout.

A checkpoint is a directory holding a variant's files under their official names (see
``Variant.files``). It comes from a local directory or from a Hugging Face hub repo id;
hub downloads go through ``huggingface_hub`` (cached, honouring ``HF_HUB_OFFLINE``,
``HF_TOKEN``, ``HF_HOME`` and ``HF_ENDPOINT``). Before downloading, the hub is probed with a short
timeout: when it cannot be reached, a complete snapshot in the local cache is used, else loading
fails at once with one line naming the ways out (instead of retrying for minutes).
"""
from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from chorus.models.variants import Variant

logger = logging.getLogger(__name__)

RANDOM_WEIGHTS_MARKER = "CHORUS_RANDOM_WEIGHTS.txt"  # written by chorus checkpoint random
HUB_PROBE_TIMEOUT_S = 5.0
REWRITE_HINT = ("download it again (or, for a test checkpoint, rewrite the directory with "
                "`chorus checkpoint random`)")
DTYPE_CHOICES = ("auto", "fp32", "bf16", "fp16")
SLOW_CPU_DTYPES = (torch.bfloat16, torch.float16)

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}


class CheckpointNotFoundError(FileNotFoundError):
    """A checkpoint directory or some of its files could not be found."""


class HubUnreachableError(CheckpointNotFoundError):
    """The hub cannot be reached and the local cache lacks the files."""


class CheckpointFileError(ValueError):
    """A checkpoint file exists but cannot be read (corrupt, truncated, wrong format)."""


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


def resolve_dtype(name: str | torch.dtype | None, device: str | torch.device | None) -> torch.dtype:
    """The one place a dtype choice is resolved against the device.

    ``"auto"`` (or None) is bf16 on CUDA and fp32 on the CPU. An explicit bf16/fp16 on the CPU
    is honoured with one warning: the CPU has no fast half-precision path (about 13x slower than
    fp32 for T3 decoding on 2 cores).
    """
    device = parse_device(device)
    if name is None or (isinstance(name, str) and name.lower() == "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = parse_dtype(name)
    if device.type == "cpu" and dtype in SLOW_CPU_DTYPES:
        logger.warning("%s on the CPU is much slower than fp32 (about 13x for T3); "
                       "use --dtype fp32 or auto unless you are testing %s", dtype_name(dtype), dtype_name(dtype))
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """torch dtype -> ``"fp32" | "bf16" | "fp16"``."""
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


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
    return (f"the {variant.name} checkpoint at {where} lacks {len(missing)} required file(s): "
            f"{', '.join(missing)}.\n{_ways_out(variant)}")


def _ways_out(variant: Variant) -> str:
    return (f"Point Chorus at a local directory holding the official files "
            f"({', '.join(variant.files.required)}) with --checkpoint DIR, or make them reachable on "
            f"the hub (unset HF_HUB_OFFLINE, set HF_TOKEN for gated repos). "
            f"`chorus checkpoint random --variant {variant.name} --out DIR` writes a random-weight "
            f"directory for testing.")


def resolve_checkpoint_dir(variant: Variant, location: str | os.PathLike | None = None,
                           *, revision: str | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a local directory with every required file of ``variant``.

    ``location`` is a local directory, a hub repo id, or None for the variant's official repo.
    Optional files (``conds.pt``, the Chinese Cangjie table) are fetched when available.
    Raises :class:`CheckpointNotFoundError` naming every missing file.
    """
    given = location is not None
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
    try:
        return _download_from_hub(variant, location, revision, cache_dir)
    except CheckpointNotFoundError as exc:
        if not given:
            raise
        # "owner/name" is also a relative path: say that both readings failed
        raise type(exc)(f"no directory {location!r} in {os.getcwd()}, and {exc}") from None


def _download_from_hub(variant: Variant, repo_id: str, revision: str | None,
                       cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if not constants.HF_HUB_OFFLINE:
        unreachable = hub_unreachable_reason(constants.ENDPOINT)
        if unreachable is not None:
            cached = cached_snapshot(variant, repo_id, revision, cache_dir)
            if cached is not None:
                logger.warning("the hub at %s cannot be reached (%s); using the cached snapshot of %s",
                               constants.ENDPOINT, unreachable, repo_id)
                return cached
            raise HubUnreachableError(
                f"no hub repo {repo_id!r} with the {variant.name} files in the local cache, and the Hugging Face "
                f"hub at {constants.ENDPOINT} cannot be reached ({unreachable}): pass --checkpoint DIR with a local "
                f"checkpoint, set HF_HUB_OFFLINE=1 to use only the cache, or set HTTPS_PROXY if the hub is reached "
                f"through a proxy")

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
        offline = " (HF_HUB_OFFLINE is set: only the local cache was searched)" if constants.HF_HUB_OFFLINE else ""
        errors = f"(errors: {', '.join(sorted(reasons))})"
        if directory is None:  # not one file: no such repo (or not in the cache)
            raise CheckpointNotFoundError(f"no hub repo {repo_id!r} with the {variant.name} files{offline} {errors}."
                                          f"\n{_ways_out(variant)}")
        raise CheckpointNotFoundError(
            _missing_files_message(variant, f"hub repo {repo_id!r}{offline}", missing) + f"\n{errors}")
    assert directory is not None
    return directory


def hub_unreachable_reason(endpoint: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None when ``endpoint`` answers an HTTP request (any status) within ``timeout`` seconds,
    else a short reason. Proxies from the environment (``HTTPS_PROXY``) are honoured."""
    import socket
    import urllib.error
    import urllib.request

    request = urllib.request.Request(endpoint.rstrip("/") + "/api/whoami-v2", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return f"no answer within {timeout:g} s"
        return str(reason) or type(reason).__name__


def cached_snapshot(variant: Variant, repo_id: str, revision: str | None = None,
                    cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The directory of a cached snapshot of ``repo_id`` holding every required file of
    ``variant`` (found without any network access), or None."""
    from huggingface_hub import hf_hub_download

    directory: Path | None = None
    for name in (*variant.files.required, variant.files.conds, *variant.files.optional):
        try:
            path = Path(hf_hub_download(repo_id, name, revision=revision, cache_dir=cache_dir,
                                        local_files_only=True))
        except Exception:  # noqa: BLE001 - any failure means "not cached"
            if name in variant.files.required:
                return None
            continue
        directory = directory or path.parent
    return directory


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` or ``.pt`` state dict onto the CPU.

    T3 files may wrap the state dict as ``{"model": [state, ...]}`` (training checkpoints);
    that wrapper is unwrapped here.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            state: Any = load_file(str(path), device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types
            raise CheckpointFileError(
                f"could not read checkpoint file {path}: not a valid safetensors file, corrupt or truncated "
                f"({_short(exc)}); {REWRITE_HINT}") from None
    else:
        state = load_torch_file(path)
    if isinstance(state, Mapping) and "model" in state and not isinstance(state["model"], torch.Tensor):
        state = state["model"][0]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint file {path} does not hold a flat state dict of tensors")
    return dict(state)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 100 else text[:97] + "..."


def load_torch_file(path: str | os.PathLike) -> Any:
    """``torch.load`` of a weights-only ``.pt`` file onto the CPU, with an error naming the file
    and the fix. Never falls back to (or suggests) unrestricted unpickling."""
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        detail = "not a weights-only PyTorch file: corrupt, or holding Python objects Chorus does not load"
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, OSError, EOFError ...
        message = _short(exc)
        detail = "corrupt or truncated" + ("" if "weights_only" in message else f" ({message})")
    raise CheckpointFileError(f"could not read checkpoint file {path}: {detail}; {REWRITE_HINT}") from None


def with_t3_weights(variant: Variant, file_name: str | None) -> Variant:
    """``variant`` reading its T3 weights from ``file_name`` (a file in the checkpoint directory
    or hub repo) instead of its official name; None keeps the official name. Same architecture,
    other weights: e.g. a multilingual finetune shipped as ``t3_<lang>.safetensors``."""
    if file_name is None or file_name == variant.files.t3:
        return variant
    if (not isinstance(file_name, str) or not file_name.endswith(".safetensors") or file_name != Path(file_name).name
            or "\\" in file_name or file_name.startswith(".")):
        raise ValueError(f"t3_weights must be a file name ending in .safetensors (a file inside the checkpoint "
                         f"directory or hub repo, no folders), got {file_name!r}")
    return replace(variant, files=replace(variant.files, t3=file_name))


@dataclass(frozen=True)
class Checkpoint:
    """A resolved checkpoint directory of one variant."""

    variant: Variant
    directory: Path

    @classmethod
    def open(cls, variant: Variant, location: str | os.PathLike | None = None,
             *, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
             t3_weights: str | None = None) -> "Checkpoint":
        """``t3_weights``: the T3 weights' file name when it is not the variant's official one
        (see :func:`with_t3_weights`); a missing file is named in the error like any other."""
        variant = with_t3_weights(variant, t3_weights)
        return cls(variant, resolve_checkpoint_dir(variant, location, revision=revision, cache_dir=cache_dir))

    def path(self, name: str) -> Path:
        return self.directory / name

    def t3_state(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.path(self.variant.files.t3))

    def voice_encoder_state(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.path(self.variant.files.voice_encoder))

    def s3gen_state(self) -> dict[str, torch.Tensor]:
        return read_state_dict(self.path(self.variant.files.s3gen))

    @property
    def has_random_weights(self) -> bool:
        """Whether this is a random-weight checkpoint (it carries the marker file)."""
        return self.path(RANDOM_WEIGHTS_MARKER).is_file()

    def has_builtin_voice(self) -> bool:
        return self.path(self.variant.files.conds).is_file()

    def builtin_voice_state(self) -> dict[str, Any]:
        """The raw ``conds.pt`` dict: ``{"t3": {...}, "gen": {...}}``."""
        path = self.path(self.variant.files.conds)
        if not path.is_file():
            raise CheckpointNotFoundError(
                f"{path} does not exist: this checkpoint has no built-in voice; pass a reference clip"
            )
        state = load_torch_file(path)
        if not isinstance(state, Mapping) or "t3" not in state or "gen" not in state:
            raise CheckpointFileError(f"{path} is not a Chatterbox conditionals file (expected keys 't3' and "
                                      f"'gen'); {REWRITE_HINT}")
        return dict(state)


def load_t3(checkpoint: Checkpoint, *, dtype: str | torch.dtype = "fp32",
            device: str | torch.device | None = "cpu"):
    """Build the T3 model of ``checkpoint`` with its weights, converted once to ``dtype``."""
    from chorus.models.t3.model import T3Model

    return T3Model.from_state_dict(
        checkpoint.variant.t3, checkpoint.t3_state(), dtype=parse_dtype(dtype),
        device=parse_device(device), source=str(checkpoint.path(checkpoint.variant.files.t3)),
    )
