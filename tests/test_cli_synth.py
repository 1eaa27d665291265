"""``chorus synth`` and ``chorus voice create`` end to end on a full-size random-weight Nano
checkpoint: files of each format with the expected length, and one-line errors (exit code 2) for
bad inputs, raised before any model loads. Also the audio file writer behind ``--out``."""
from __future__ import annotations

import os
import random
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from chorus.cli import main
from chorus.models.loading import Checkpoint
from chorus.models.variants import get_variant
from chorus.voices import Voice
from tests.conftest import DATA_DIR
from tests.voices.checkpoints import light_checkpoint, shared_checkpoint

N = 6
EXPECTED_SAMPLES = (N + 3) * 960  # Nano appends 3 silence tokens
FIXED = ["--max-new-tokens", str(N), "--min-new-tokens", str(N), "--seed", "11", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def nano_dir():
    return str(shared_checkpoint("nano"))


@pytest.fixture(scope="module")
def short_voice_file(nano_dir, module_tmp_path_factory):
    """A 2 s cut of the built-in voice, saved as a voice file (keeps S3Gen's prompt short)."""
    builtin = Voice.from_conditionals(Checkpoint(get_variant("nano"), Path(nano_dir)).builtin_voice_state())
    short = replace(builtin, t3_prompt_tokens=builtin.t3_prompt_tokens[:, :75],
                    s3gen_prompt_tokens=builtin.s3gen_prompt_tokens[:, :50],
                    s3gen_prompt_mel=builtin.s3gen_prompt_mel[:, :100], name="short")
    return str(short.save(module_tmp_path_factory.mktemp("voices") / "short.safetensors"))


def _error(capsys, argv: list[str]) -> str:
    """Run the CLI expecting a user error: exit code 2 and one ``chorus: error:`` line, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.startswith("chorus: error:")]
    assert len(lines) == 1, err
    assert err.strip().splitlines()[-1] == lines[0]
    return lines[0]


@pytest.mark.fullsize
def test_synth_writes_wav_and_flac_of_the_forced_length(nano_dir, short_voice_file, tmp_path, capsys):
    decoded = {}
    for fmt in ("wav", "flac"):
        out = tmp_path / f"out.{fmt}"
        assert main(["synth", "--variant", "nano", "--checkpoint", nano_dir, "--voice", short_voice_file,
                     "--out", str(out), *FIXED, "Hello from the command line."]) == 0
        assert f"wrote {out}" in capsys.readouterr().out
        samples, sample_rate = soundfile.read(str(out), dtype="float32")
        assert sample_rate == 24000 and samples.shape == (EXPECTED_SAMPLES,)
        assert soundfile.info(str(out)).subtype == "PCM_16"
        decoded[fmt] = samples
    assert np.array_equal(decoded["wav"], decoded["flac"])  # same seed, same 16-bit samples


@pytest.mark.fullsize
def test_voice_create_and_synth_from_a_clip_to_mp3(nano_dir, tmp_path, capsys):
    clip = os.path.join(DATA_DIR, "sample-01.mp3")  # 5.7 s: Nano needs more than 5 s
    voice_path = tmp_path / "me.safetensors"
    assert main(["voice", "create", "--variant", "nano", "--checkpoint", nano_dir, "--audio", clip,
                 "--out", str(voice_path), "--device", "cpu"]) == 0
    assert "wrote voice 'sample-01'" in capsys.readouterr().out
    voice = Voice.load(voice_path)
    assert voice.t3_prompt_tokens.shape[1] == 143 and voice.s3gen_prompt_mel.shape[1] == 286

    out = tmp_path / "out.mp3"
    text_file = tmp_path / "text.txt"
    text_file.write_text("Read from a file.", encoding="utf-8")
    assert main(["synth", "--variant", "nano", "--checkpoint", nano_dir, "--voice", clip, "--text-file",
                 str(text_file), "--out", str(out), *FIXED]) == 0
    samples, sample_rate = soundfile.read(str(out), dtype="float32")
    assert sample_rate == 24000
    assert abs(samples.shape[0] - EXPECTED_SAMPLES) <= 1152  # MP3 frames may pad the end


@pytest.fixture(scope="module")
def multilingual_dir(module_tmp_path_factory):
    return light_checkpoint("multilingual", module_tmp_path_factory.mktemp("mtl"))


@pytest.fixture(scope="module")
def light_nano_dir(module_tmp_path_factory):
    return light_checkpoint("nano", module_tmp_path_factory.mktemp("nano-light"))


def test_unknown_or_missing_language_for_multilingual(multilingual_dir, tmp_path, capsys):
    base = ["synth", "--variant", "multilingual", "--checkpoint", multilingual_dir, "--out", str(tmp_path / "o.wav")]
    assert "unsupported language 'xx'" in _error(capsys, [*base, "--language", "xx", "Bonjour."])
    assert "a language code is required" in _error(capsys, [*base, "Bonjour."])


def test_corrupt_voice_file(light_nano_dir, tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00\x01 definitely not a voice")
    line = _error(capsys, ["synth", "--variant", "nano", "--checkpoint", light_nano_dir, "--voice", str(bad),
                           "--out", str(tmp_path / "o.wav"), "Hello."])
    assert "is not a Chorus voice file" in line


def test_reference_clip_too_short_or_undecodable(light_nano_dir, tmp_path, capsys):
    base = ["synth", "--variant", "nano", "--checkpoint", light_nano_dir, "--out", str(tmp_path / "o.wav")]
    short = os.path.join(DATA_DIR, "sample-02.mp3")  # 3.8 s
    assert "needs more than 5 s" in _error(capsys, [*base, "--voice", short, "Hello."])
    garbage = tmp_path / "noise.wav"
    garbage.write_bytes(random.Random(0).randbytes(4096))
    assert "not an audio file we can decode" in _error(capsys, [*base, "--voice", str(garbage), "Hello."])
    assert "not found" in _error(capsys, [*base, "--voice", str(tmp_path / "missing.wav"), "Hello."])
    line = _error(capsys, ["voice", "create", "--variant", "nano", "--checkpoint", light_nano_dir, "--audio", short,
                           "--out", str(tmp_path / "v.safetensors")])
    assert "needs more than 5 s" in line


def test_other_bad_arguments(light_nano_dir, tmp_path, capsys):
    base = ["synth", "--variant", "nano", "--checkpoint", light_nano_dir]
    assert ".wav, .flac or .mp3" in _error(capsys, [*base, "--out", str(tmp_path / "o.ogg"), "Hello."])
    assert "exactly one" in _error(capsys, [*base, "--out", str(tmp_path / "o.wav")])
    assert "text is empty" in _error(capsys, [*base, "--out", str(tmp_path / "o.wav"), "   "])
    assert "unknown variant" in _error(capsys, ["synth", "--variant", "nope", "--out", "o.wav", "Hi."])
    assert "does not exist" in _error(capsys, ["synth", "--variant", "nano", "--checkpoint",
                                               str(tmp_path / "none"), "--out", "o.wav", "Hi."])
    assert ".safetensors" in _error(capsys, ["voice", "create", "--variant", "nano", "--checkpoint", light_nano_dir,
                                             "--audio", os.path.join(DATA_DIR, "sample-01.mp3"), "--out", "v.bin"])


def test_watermark_without_a_working_perth_is_a_clear_error(light_nano_dir, tmp_path, capsys, monkeypatch):
    import chorus.watermark as watermark

    watermark._cached.cache_clear()
    fake = types.ModuleType("perth")
    fake.WatermarkerBase = type("WatermarkerBase", (), {})
    fake.PerthImplicitWatermarker = None  # what resemble-perth does when its import fails
    monkeypatch.setitem(sys.modules, "perth", fake)
    line = _error(capsys, ["synth", "--variant", "nano", "--checkpoint", light_nano_dir, "--watermark", "perth",
                           "--out", str(tmp_path / "o.wav"), "Hello."])
    assert "setuptools<82" in line and "resemble-perth" in line
    watermark._cached.cache_clear()
    assert torch.get_num_threads() <= 2


# ---- the audio writer -------------------------------------------------------------------------------

def _tone(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(24000 * seconds)) / 24000
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_format_comes_from_the_extension():
    from chorus.audio.encode import UnsupportedFormatError, format_from_path

    assert [format_from_path(p) for p in ("a.wav", "B.WAV", "c.flac", "d.mp3")] == ["wav", "wav", "flac", "mp3"]
    with pytest.raises(UnsupportedFormatError):
        format_from_path("x.ogg")


def test_wav_and_flac_hold_the_same_rounded_16_bit_samples(tmp_path):
    from chorus.audio.encode import write_audio
    from chorus.audio.pcm import to_pcm16

    wav = np.concatenate([_tone(), np.array([1.5, -1.5, 0.25], np.float32)])  # out-of-range samples clip
    for fmt in ("wav", "flac"):
        path = write_audio(tmp_path / f"x.{fmt}", wav, 24000)
        samples, rate = soundfile.read(str(path), dtype="int16")
        assert rate == 24000 and np.array_equal(samples, to_pcm16(wav))
    assert to_pcm16(np.array([1.5, -1.5, 0.25], np.float32)).tolist() == [32767, -32767, 8192]


@pytest.mark.parametrize("via_pyav", [False, True])
def test_mp3_round_trips(tmp_path, monkeypatch, via_pyav):
    from chorus.audio import encode

    if via_pyav:
        pytest.importorskip("av")
        monkeypatch.setattr(encode, "soundfile_writes_mp3", lambda: False)
    elif not encode.soundfile_writes_mp3():
        pytest.skip("this libsndfile cannot write MP3")
    path = encode.write_audio(tmp_path / "x.mp3", _tone(2.0), 24000)
    samples, rate = soundfile.read(str(path), dtype="float32")
    assert rate == 24000 and abs(samples.shape[0] - 48000) <= 1152
    assert np.abs(samples).max() > 0.3


def test_bad_samples_are_refused():
    from chorus.audio.encode import encode_audio

    with pytest.raises(ValueError, match="NaN"):
        encode_audio(np.array([0.0, np.nan], np.float32), 24000, "wav")
    with pytest.raises(ValueError, match="mono"):
        encode_audio(np.zeros((2, 10), np.float32), 24000, "wav")
