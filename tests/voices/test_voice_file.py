"""Voice files record the variant and sample rate they were built for; a mismatch is refused."""
from __future__ import annotations

import logging

import pytest
from safetensors.torch import save_file

from chorus.models.random_checkpoint import random_builtin_voice
from chorus.models.variants import get_variant
from chorus.voices import Voice, VoiceFormatError


def _voice(variant_name: str | None) -> Voice:
    voice = Voice.from_conditionals(random_builtin_voice(get_variant("turbo"), 0), name="me")
    return Voice(voice.speaker_embedding, voice.t3_prompt_tokens, voice.s3gen_prompt_tokens,
                 voice.s3gen_prompt_mel, voice.xvector, name="me", variant=variant_name)


def test_the_variant_round_trips_through_the_file(tmp_path):
    path = _voice("turbo").save(tmp_path / "me.safetensors")
    assert Voice.load(path).variant == "turbo"


def test_a_turbo_voice_is_refused_by_the_original_variant(tmp_path):
    voice = Voice.load(_voice("turbo").save(tmp_path / "me.safetensors"))
    with pytest.raises(VoiceFormatError, match="built for the turbo variant, not original"):
        voice.check_variant(get_variant("original"))
    assert voice.check_variant(get_variant("turbo")) is voice


def test_multilingual_v2_and_v3_share_voices():
    _voice("multilingual").check_variant(get_variant("multilingual-v3"))


def test_an_old_file_without_a_variant_loads_with_a_warning(tmp_path, caplog):
    voice = _voice(None)
    tensors = {k: getattr(voice, k).contiguous() for k in
               ("speaker_embedding", "t3_prompt_tokens", "s3gen_prompt_tokens", "s3gen_prompt_mel", "xvector")}
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata={"format": "chorus-voice/1", "name": "old"})
    with caplog.at_level(logging.WARNING):
        loaded = Voice.load(tmp_path / "old.safetensors")
    assert loaded.variant is None and "does not record the variant" in caplog.text
    loaded.check_variant(get_variant("original"))  # unknown origin: accepted


def test_a_file_of_another_sample_rate_is_refused(tmp_path):
    voice = _voice("turbo")
    tensors = {k: getattr(voice, k).contiguous() for k in
               ("speaker_embedding", "t3_prompt_tokens", "s3gen_prompt_tokens", "s3gen_prompt_mel", "xvector")}
    save_file(tensors, str(tmp_path / "v.safetensors"),
              metadata={"format": "chorus-voice/1", "name": "v", "variant": "turbo", "sample_rate": "16000"})
    with pytest.raises(VoiceFormatError, match="16000 Hz"):
        Voice.load(tmp_path / "v.safetensors")


def test_an_interrupted_save_leaves_the_previous_file(tmp_path, monkeypatch):
    import pathlib

    path = _voice("turbo").save(tmp_path / "me.safetensors")
    before = path.read_bytes()

    def interrupted(self, data):
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(pathlib.Path, "write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _voice("nano").save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["me.safetensors"]
