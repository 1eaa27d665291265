import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from chorus.models.loading import (
    Checkpoint, CheckpointNotFoundError, parse_device, parse_dtype, read_state_dict, resolve_checkpoint_dir,
)
from chorus.models.variants import get_variant

ORIGINAL = get_variant("original")


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
