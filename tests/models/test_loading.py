from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from chorus.models.loading import (
    Checkpoint, CheckpointNotFoundError, parse_device, parse_dtype, read_state_dict, resolve_checkpoint_dir,
)
from chorus.models.variants import get_variant

ORIGINAL = get_variant("original")
TURBO = get_variant("turbo")


def _touch_required(directory: Path, variant=ORIGINAL, skip=()):
    for name in variant.files.required:
        if name not in skip:
            (directory / name).write_bytes(b"")


def test_local_directory_with_every_file_resolves(tmp_path):
    _touch_required(tmp_path)
    assert resolve_checkpoint_dir(ORIGINAL, tmp_path) == tmp_path


def test_local_directory_missing_files_names_them(tmp_path):
    _touch_required(tmp_path, skip=("t3_cfg.safetensors", "tokenizer.json"))
    with pytest.raises(CheckpointNotFoundError) as info:
        resolve_checkpoint_dir(ORIGINAL, tmp_path)
    msg = str(info.value)
    assert "t3_cfg.safetensors" in msg and "tokenizer.json" in msg and "ve.safetensors" not in msg.split("lacks")[1].split("\n")[0]
    assert "--checkpoint DIR" in msg


def test_nonexistent_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        resolve_checkpoint_dir(ORIGINAL, tmp_path / "nope")


def test_offline_hub_miss_names_files_and_offline_mode(tmp_path, monkeypatch):
    # conftest sets HF_HUB_OFFLINE=1 before huggingface_hub is imported
    with pytest.raises(CheckpointNotFoundError) as info:
        resolve_checkpoint_dir(ORIGINAL, "nobody-here/no-such-repo", cache_dir=tmp_path)
    msg = str(info.value)
    assert "HF_HUB_OFFLINE" in msg and "t3_cfg.safetensors" in msg and "no-such-repo" in msg


def test_a_path_shaped_like_a_hub_id_that_is_neither_says_both(tmp_path, monkeypatch):
    """The README's ``ckpt/turbo`` before it is written: no such directory here, and no such repo
    in the cache (offline: conftest sets HF_HUB_OFFLINE=1)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError) as info:
        resolve_checkpoint_dir(TURBO, "ckpt/turbo", cache_dir=tmp_path / "hub")
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"no directory 'ckpt/turbo' in {tmp_path}, and no hub repo 'ckpt/turbo' with the turbo "
                            f"files (HF_HUB_OFFLINE is set"), first
    assert "`chorus checkpoint random --variant turbo --out DIR`" in str(info.value)


def test_a_hub_id_that_is_no_directory_and_unreachable_says_both(tmp_path, monkeypatch):
    """Online, with the hub unreachable (a closed loopback port) and nothing cached."""
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:  # a port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", closed)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError) as info:
        resolve_checkpoint_dir(TURBO, "ckpt/turbo", cache_dir=tmp_path / "hub")
    message = str(info.value)
    assert message.startswith(f"no directory 'ckpt/turbo' in {tmp_path}, and no hub repo 'ckpt/turbo' with the "
                              f"turbo files in the local cache, and the Hugging Face hub at {closed} cannot be "
                              f"reached ("), message
    assert "--checkpoint DIR" in message and "HF_HUB_OFFLINE=1" in message


def test_the_default_repo_is_not_called_a_missing_directory(tmp_path):
    with pytest.raises(CheckpointNotFoundError) as info:
        resolve_checkpoint_dir(TURBO, None, cache_dir=tmp_path)
    assert str(info.value).startswith(f"no hub repo {TURBO.hub_repo!r} with the turbo files"), str(info.value)


def test_hub_cache_is_used_offline(tmp_path):
    """A repo already in the hub cache resolves without network access."""
    repo = tmp_path / "models--ResembleAI--chatterbox"
    commit = "0" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    _touch_required(snap)
    got = resolve_checkpoint_dir(ORIGINAL, None, cache_dir=tmp_path)
    assert got == snap and (got / "t3_cfg.safetensors").exists()


def test_read_state_dict_unwraps_training_wrapper(tmp_path):
    state = {"w": torch.ones(2)}
    torch.save({"model": [state]}, tmp_path / "t3.pt")
    assert torch.equal(read_state_dict(tmp_path / "t3.pt")["w"], torch.ones(2))


def test_read_state_dict_reads_safetensors(tmp_path):
    save_file({"w": torch.arange(3.0)}, str(tmp_path / "x.safetensors"))
    assert read_state_dict(tmp_path / "x.safetensors")["w"].tolist() == [0.0, 1.0, 2.0]


def test_corrupt_file_gives_a_readable_error(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="could not read checkpoint file"):
        read_state_dict(tmp_path / "x.safetensors")


def test_builtin_voice_missing_is_explained(tmp_path):
    _touch_required(tmp_path)
    ckpt = Checkpoint.open(ORIGINAL, tmp_path)
    assert not ckpt.has_builtin_voice()
    with pytest.raises(CheckpointNotFoundError, match="no built-in voice"):
        ckpt.builtin_voice_state()


@pytest.mark.parametrize("name,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("FP16", torch.float16)])
def test_parse_dtype(name, dtype):
    assert parse_dtype(name) is dtype


def test_parse_dtype_rejects_unknown():
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        parse_dtype("int8")


def test_parse_device_rejects_cuda_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        parse_device("cuda")
    assert parse_device("auto").type == "cpu"


# ---- dtype defaults depend on the device ------------------------------------------------------

def test_auto_dtype_is_fp32_on_the_cpu_and_bf16_on_cuda(monkeypatch):
    from chorus.models.loading import resolve_dtype

    assert resolve_dtype("auto", "cpu") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_dtype("auto", "cuda") is torch.bfloat16


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_half_precision_on_the_cpu_warns_once(name, caplog):
    from chorus.models.loading import resolve_dtype

    with caplog.at_level("WARNING"):
        assert resolve_dtype(name, "cpu") is parse_dtype(name)
    assert len(caplog.records) == 1 and "slower than fp32" in caplog.text


def test_fp32_on_the_cpu_does_not_warn(caplog):
    from chorus.models.loading import resolve_dtype

    with caplog.at_level("WARNING"):
        resolve_dtype("fp32", "cpu")
    assert caplog.records == []


# ---- unreadable files name the file and the fix -----------------------------------------------

def _conds_checkpoint(tmp_path) -> Checkpoint:
    _touch_required(tmp_path)
    return Checkpoint.open(ORIGINAL, tmp_path)


def test_truncated_conds_names_the_file_and_the_fix(tmp_path):
    from chorus.models.loading import CheckpointFileError
    from chorus.models.random_checkpoint import random_builtin_voice

    ckpt = _conds_checkpoint(tmp_path)
    torch.save(random_builtin_voice(ORIGINAL, 0), tmp_path / "conds.pt")
    data = (tmp_path / "conds.pt").read_bytes()
    (tmp_path / "conds.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFileError) as info:
        ckpt.builtin_voice_state()
    assert str(tmp_path / "conds.pt") in str(info.value) and "download it again" in str(info.value)


def test_conds_with_python_objects_is_refused_without_suggesting_unsafe_loading(tmp_path):
    from chorus.models.loading import CheckpointFileError

    ckpt = _conds_checkpoint(tmp_path)
    torch.save({"t3": {"obj": Path("x")}, "gen": {}}, tmp_path / "conds.pt")  # not weights-only loadable
    with pytest.raises(CheckpointFileError) as info:
        ckpt.builtin_voice_state()
    message = str(info.value)
    assert str(tmp_path / "conds.pt") in message and "weights_only" not in message and "\n" not in message


def test_truncated_safetensors_names_the_file_and_the_fix(tmp_path):
    save_file({"w": torch.arange(300.0)}, str(tmp_path / "x.safetensors"))
    data = (tmp_path / "x.safetensors").read_bytes()
    (tmp_path / "x.safetensors").write_bytes(data[:-100])
    with pytest.raises(ValueError) as info:
        read_state_dict(tmp_path / "x.safetensors")
    assert str(tmp_path / "x.safetensors") in str(info.value) and "download it again" in str(info.value)


# ---- an unreachable hub ----------------------------------------------------------------------

def test_unreachable_hub_uses_a_complete_cached_snapshot(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    from chorus.models import loading

    repo = tmp_path / "models--ResembleAI--chatterbox"
    commit = "1" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    _touch_required(snap)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading, "hub_unreachable_reason", lambda endpoint: "connection refused")
    assert resolve_checkpoint_dir(ORIGINAL, None, cache_dir=tmp_path) == snap


def test_hub_probe_reports_a_closed_port_at_once():
    import socket
    import time

    from chorus.models.loading import hub_unreachable_reason

    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    assert hub_unreachable_reason(f"http://127.0.0.1:{port}", timeout=2.0) is not None
    assert time.monotonic() - start < 20


def _renamed_t3_checkpoint(directory: Path, t3_name: str):
    """A tiny multilingual checkpoint whose T3 file is ``t3_name``: random T3 weights, the other
    required files present but empty (only T3 is read)."""
    from chorus.models.random_checkpoint import write_random_checkpoint
    from chorus.models.variants import tiny_variant

    variant = tiny_variant("multilingual")
    write_random_checkpoint(variant, directory, components=("t3",))
    (directory / variant.files.t3).rename(directory / t3_name)
    _touch_required(directory, variant, skip=(variant.files.t3,))
    return variant


def test_t3_weights_loads_a_renamed_t3_file(tmp_path):
    from chorus.models.loading import load_t3

    variant = _renamed_t3_checkpoint(tmp_path, "t3_pt-BR.safetensors")
    checkpoint = Checkpoint.open(variant, tmp_path, t3_weights="t3_pt-BR.safetensors")
    model = load_t3(checkpoint)
    stored = read_state_dict(tmp_path / "t3_pt-BR.safetensors")
    assert checkpoint.variant.name == variant.name
    assert torch.equal(model.state_dict()["tfmr.layers.0.self_attn.q_proj.weight"],
                       stored["tfmr.layers.0.self_attn.q_proj.weight"])


def test_without_t3_weights_a_renamed_t3_file_is_missing_by_its_official_name(tmp_path):
    variant = _renamed_t3_checkpoint(tmp_path, "t3_pt-BR.safetensors")
    with pytest.raises(CheckpointNotFoundError, match=r"lacks 1 required file\(s\): t3_mtl23ls_v2\.safetensors"):
        Checkpoint.open(variant, tmp_path)


def test_missing_t3_weights_file_is_named(tmp_path):
    variant = _renamed_t3_checkpoint(tmp_path, "t3_pt-BR.safetensors")
    with pytest.raises(CheckpointNotFoundError, match=r"lacks 1 required file\(s\): t3_hi\.safetensors"):
        Checkpoint.open(variant, tmp_path, t3_weights="t3_hi.safetensors")


@pytest.mark.parametrize("name", ["t3_hi.pt", "packs/t3_hi.safetensors", "/abs/t3_hi.safetensors",
                                  "..safetensors", ""])
def test_t3_weights_must_be_a_safetensors_file_name(tmp_path, name):
    with pytest.raises(ValueError, match="t3_weights must be a file name ending in .safetensors"):
        Checkpoint.open(get_variant("multilingual"), tmp_path, t3_weights=name)
