"""``chorus vc`` end to end through ``main([...])`` on a random-weight checkpoint whose T3 and
voice-encoder files are empty stand-ins (the checkpoint's layout is checked, but the command
reads only the S3Gen file and the built-in voice). S3Gen is full size there (the command loads
the official layout only, so no tiny checkpoint can stand in), hence ``fullsize``; the source is
1 s and the solver runs 2 steps. The refusals run on a light checkpoint (empty stand-ins for every
weight file): they must all come before any model loads."""
from __future__ import annotations

import os

import numpy as np
import pytest
import soundfile

from chorus.cli import main
from chorus.models.random_checkpoint import write_random_checkpoint
from chorus.models.variants import get_variant
from tests.conftest import DATA_DIR
from tests.conversion.tiny_conversion import speech
from tests.voices.checkpoints import light_checkpoint

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def s3gen_only(module_tmp_path_factory):
    directory = module_tmp_path_factory.mktemp("vc-checkpoint") / "turbo"
    variant = get_variant("turbo")
    write_random_checkpoint(variant, directory, components=("s3gen", "conds", "tokenizer"))
    for name in (variant.files.voice_encoder, variant.files.t3):
        (directory / name).touch()  # loading them would fail
    return str(directory)


@pytest.fixture(scope="module")
def source(module_tmp_path_factory):
    path = module_tmp_path_factory.mktemp("vc-source") / "source.wav"
    soundfile.write(str(path), speech(1.0), 16000)
    return str(path)


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.fullsize
def test_vc_converts_a_file_to_a_target_clip(s3gen_only, source, tmp_path, capsys):
    out = tmp_path / "out.wav"
    clip = os.path.join(DATA_DIR, "sample-02.mp3")
    assert main(["vc", source, "--voice", clip, "--out", str(out), "--variant", "turbo", "--checkpoint", s3gen_only,
                 "--device", "cpu", "--seed", "3", "--flow-steps", "2"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    samples, rate = soundfile.read(str(out), dtype="float32")
    assert rate == 24000 and samples.shape == (25 * 960,)  # 1 s = 25 tokens, 960 samples each
    assert np.isfinite(samples).all() and np.abs(samples).max() > 0


def test_vc_refuses_bad_input_before_loading_s3gen(source, tmp_path, capsys):
    light = light_checkpoint("turbo", tmp_path / "light")
    out = str(tmp_path / "out.wav")
    base = ["--variant", "turbo", "--checkpoint", light, "--device", "cpu", "--out", out]
    assert "the limit is 0.5 s" in _error(capsys, ["vc", source, "--voice", "default", "--max-source-s", "0.5", *base])
    assert "not a voice id" in _error(capsys, ["vc", source, "--voice", "No Such Voice!", *base])
    silent = tmp_path / "silent.wav"
    soundfile.write(str(silent), np.zeros(16000, np.float32), 16000)
    assert "silent" in _error(capsys, ["vc", str(silent), "--voice", "default", *base])
    assert "no voices directory" in _error(capsys, ["vc", source, "--voice", "someone", "--voices-dir",
                                                    str(tmp_path / "none"), *base])
    assert not os.path.exists(out)


def test_vc_refuses_a_stored_voice_not_built_for_its_variant(source, tmp_path, capsys):
    from chorus.voices.store import VoiceStore
    from tests.voices.front_ends import tiny_front_end
    from tests.voices.test_store import clip

    voices = tmp_path / "voices"
    voice_id = VoiceStore(voices, tiny_front_end(), get_variant("original"), builtin=None).add(clip(6.0)).id
    light = light_checkpoint("turbo", tmp_path / "light")
    out = str(tmp_path / "out.wav")
    error = _error(capsys, ["vc", source, "--voice", voice_id, "--voices-dir", str(voices), "--variant", "turbo",
                            "--checkpoint", light, "--device", "cpu", "--out", out])
    assert f"--voice {voice_id}: voice '{voice_id}' has not been built for the turbo models yet" in error
    assert not os.path.exists(out)
