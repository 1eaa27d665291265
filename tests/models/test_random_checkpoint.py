import os

import pytest
import torch
from safetensors import safe_open

from chorus.cli import main
from chorus.models.loading import Checkpoint, load_t3, read_state_dict
from chorus.models.random_checkpoint import (
    COMPONENTS, NOISE_WARNING, random_builtin_voice, reference_key_specs, write_random_checkpoint,
)
from chorus.models.t3.model import T3Model
from chorus.models.variants import VARIANTS, get_variant, tiny_variant
from chorus.text import load_text_encoder
from chorus.voices import Voice


@pytest.mark.parametrize("table,count", [("ve", 16), ("s3gen", 2490), ("s3genmf", 2491), ("t3en", 292),
                                         ("t3turbo", 299), ("t3nano", 155)])
def test_reference_key_tables_have_the_official_counts(table, count):
    assert len(reference_key_specs(table)) == count


@pytest.mark.parametrize("name", list(VARIANTS))
def test_tiny_checkpoint_has_official_file_names_and_loads(tmp_path, name):
    variant = tiny_variant(name)
    out = write_random_checkpoint(variant, tmp_path, components=("t3", "voice_encoder", "tokenizer", "conds"))
    for f in (variant.files.t3, variant.files.voice_encoder, *variant.files.tokenizer, variant.files.conds):
        assert (out / f).is_file(), f
    assert NOISE_WARNING in (out / "CHORUS_RANDOM_WEIGHTS.txt").read_text()
    ckpt = Checkpoint(variant, out)
    model = load_t3(ckpt, dtype="fp32", device="cpu")
    assert isinstance(model, T3Model)
    ve = read_state_dict(out / variant.files.voice_encoder)
    assert {k: tuple(v.shape) for k, v in ve.items()} == {s.name: s.shape for s in reference_key_specs("ve")}
    voice = Voice.from_conditionals(ckpt.builtin_voice_state())
    assert voice.t3_prompt_tokens.shape[1] == variant.t3.speech_cond_prompt_len
    ids = load_text_encoder(variant, out).encode("Hello there.", language="en" if variant.is_multilingual else None)
    assert ids and max(ids) < variant.t3.text_vocab_size


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    variant = tiny_variant("turbo")
    a = write_random_checkpoint(variant, tmp_path / "a", seed=1, components=("t3",))
    b = write_random_checkpoint(variant, tmp_path / "b", seed=1, components=("t3",))
    c = write_random_checkpoint(variant, tmp_path / "c", seed=2, components=("t3",))
    sa, sb, sc = (read_state_dict(d / variant.files.t3) for d in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["speech_head.weight"], sc["speech_head.weight"])


def test_builtin_voice_has_the_official_structure():
    conds = random_builtin_voice(get_variant("original"), 0)
    assert set(conds) == {"t3", "gen"}
    assert conds["t3"]["speaker_emb"].shape == (1, 256)
    assert conds["gen"]["prompt_feat"].shape == (1, 500, 80)
    assert conds["gen"]["prompt_token"].shape == (1, 250)


def test_unknown_component_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown checkpoint components"):
        write_random_checkpoint(get_variant("nano"), tmp_path, components=("t3", "vocoder"))


@pytest.mark.fullsize
def test_cli_writes_a_full_nano_checkpoint_that_checks_clean(tmp_path, capsys):
    out = tmp_path / "nano"
    assert main(["checkpoint", "random", "--variant", "nano", "--out", str(out), "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "speaks noise" in printed
    variant = get_variant("nano")
    with safe_open(str(out / variant.files.s3gen), "pt") as f:
        assert sorted(f.keys()) == sorted(s.name for s in reference_key_specs("s3genmf"))
    assert main(["checkpoint", "check", "--variant", "nano", "--checkpoint", str(out)]) == 0
    report = capsys.readouterr().out
    assert "MISMATCH" not in report and "ERROR" not in report and "conds.pt: ok" in report


def test_cli_check_reports_an_unreadable_file(tmp_path, capsys):
    variant = get_variant("nano")
    out = write_random_checkpoint(variant, tmp_path, components=("t3", "voice_encoder", "tokenizer"))
    (out / variant.files.s3gen).write_bytes(b"")  # present but unreadable
    assert main(["checkpoint", "check", "--variant", "nano", "--checkpoint", str(out)]) == 1
    report = capsys.readouterr().out
    assert "s3gen_meanflow.safetensors: ERROR (could not read checkpoint file" in report
    assert "ve.safetensors: ok" in report  # the other files are still checked


def test_cli_check_reports_a_wrong_shape(tmp_path, capsys):
    from safetensors.torch import save_file

    variant = get_variant("nano")
    out = write_random_checkpoint(variant, tmp_path, components=("t3", "voice_encoder", "tokenizer"))
    ve = read_state_dict(out / variant.files.voice_encoder)
    ve["proj.bias"] = torch.zeros(7)
    save_file(ve, str(out / variant.files.voice_encoder))
    save_file({"x": torch.zeros(1)}, str(out / variant.files.s3gen))
    assert main(["checkpoint", "check", "--variant", "nano", "--checkpoint", str(out)]) == 1
    report = capsys.readouterr().out
    assert "ve.safetensors: MISMATCH" in report and "proj.bias: expected [256], found [7]" in report
    assert "s3gen_meanflow.safetensors: MISMATCH" in report and "unexpected keys (1)" in report


def test_all_components_listed():
    assert COMPONENTS == ("t3", "voice_encoder", "s3gen", "tokenizer", "conds")


def test_interrupted_write_leaves_no_directory(tmp_path, monkeypatch):
    import chorus.text

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(chorus.text, "write_standin_tokenizer_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_random_checkpoint(tiny_variant("turbo"), tmp_path / "ckpt", components=("t3", "tokenizer"))
    assert list(tmp_path.iterdir()) == []  # neither the directory nor its temporary


def test_an_earlier_random_checkpoint_is_replaced_but_other_content_is_refused(tmp_path):
    variant = tiny_variant("turbo")
    out = write_random_checkpoint(variant, tmp_path / "ckpt", seed=1, components=("t3",))
    write_random_checkpoint(variant, out, seed=2, components=("conds",))
    assert sorted(p.name for p in out.iterdir()) == ["CHORUS_RANDOM_WEIGHTS.txt", variant.files.conds]
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "t3_cfg.safetensors").write_bytes(b"weights")
    with pytest.raises(FileExistsError, match="not empty"):
        write_random_checkpoint(variant, tmp_path / "real", components=("conds",))
    assert [p.name for p in (tmp_path / "real").iterdir()] == ["t3_cfg.safetensors"]


def test_the_files_take_the_umasks_mode_so_other_users_can_read_them(tmp_path):
    # a checkpoint written by one user is served by another (the container image's)
    previous = os.umask(0o022)
    try:
        out = write_random_checkpoint(tiny_variant("turbo"), tmp_path / "ckpt", components=("t3", "conds"))
    finally:
        os.umask(previous)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        name: "0o644" for name in ("CHORUS_RANDOM_WEIGHTS.txt", "t3_turbo_v1.safetensors", "conds.pt")}
