"""The voice store: content-addressed voices on disk, shared safely between store instances.

Voices are built by a real :class:`VoiceFrontEnd` whose three models are shrunk (random weights,
one layer each), so a build takes milliseconds; clip decoding and validation are the real ones.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from chorus.models.random_checkpoint import random_builtin_voice
from chorus.models.variants import get_variant
from chorus.voices import Voice, VoiceFrontEnd
from chorus.voices.store import (
    DEFAULT_VOICE_ID, ID_HEX_CHARS, METADATA_FORMAT, InvalidVoiceIdError, ReservedVoiceError, UnknownVoiceError,
    VoiceStore, VoiceStoreError, VoiceUploadError, upload_hash, variant_family,
)
from chorus.voices.records import family_upload_hash
from tests.conftest import DATA_DIR
from tests.voices.front_ends import tiny_front_end

ORIGINAL = get_variant("original")


@pytest.fixture(scope="module")
def front_end() -> VoiceFrontEnd:
    return tiny_front_end()


@pytest.fixture(scope="module")
def turbo_front_end() -> VoiceFrontEnd:
    return tiny_front_end(get_variant("turbo"))


@pytest.fixture(scope="module")
def builtin() -> Voice:
    return Voice.from_conditionals(random_builtin_voice(ORIGINAL, 0), name="builtin")


@pytest.fixture
def make_store(tmp_path, front_end, builtin):
    def make(root: Path | None = None, **kwargs) -> VoiceStore:
        kwargs.setdefault("builtin", builtin)
        kwargs.setdefault("max_upload_bytes", 1 << 20)
        return VoiceStore(root or tmp_path / "voices", kwargs.pop("front_end", front_end), ORIGINAL, **kwargs)

    return make


@pytest.fixture
def store(make_store) -> VoiceStore:
    return make_store()


def clip(seconds: float = 1.0, *, seed: int = 0, peak: float = 0.3, sample_rate: int = 16000,
         fmt: str = "WAV") -> bytes:
    """A synthetic speech-like clip (a tone plus noise); each seed gives different bytes."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    wav = np.sin(2 * np.pi * (150 + 10 * seed) * t) + 0.2 * rng.standard_normal(t.size)
    wav = (peak * wav / max(np.max(np.abs(wav), initial=0.0), 1e-9)).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, wav, sample_rate, format=fmt)
    return buf.getvalue()


def files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def voice_files(voice_id: str, *families: str) -> list[str]:
    """The files of a voice kept as its clip and built for ``families`` (default: original)."""
    return sorted([f"{voice_id}.clip", f"{voice_id}.json"] +
                  [f"{voice_id}.{family}.safetensors" for family in families or ("original",)])


# ------------------------------------------------------------------------------ add and get

def test_an_added_voice_round_trips(store, front_end):
    info = store.add(clip(), name="Ada")
    assert len(info.id) == ID_HEX_CHARS and info.name == "Ada" and info.variant == "original"
    assert info.duration_s == pytest.approx(1.0, abs=0.01) and info.created_at <= time.time()
    voice = store.get(info.id)
    assert voice.content_hash == front_end.build(clip()).content_hash and voice.variant == "original"
    assert store.info(info.id) == info
    assert files(store.root) == voice_files(info.id)


def test_the_metadata_record_holds_what_the_store_knows(store):
    data = clip()
    info = store.add(data, name="Ada")
    record = json.loads((store.root / f"{info.id}.json").read_text())
    assert record["format"] == METADATA_FORMAT == "chorus-voice-record/2"
    assert record["content_hash"] == upload_hash(data) and record["content_hash"].startswith(info.id)
    assert record["bytes"] == len(data) and (store.root / f"{info.id}.clip").read_bytes() == data
    assert record["first_build"] == {"variant": "original", "family": "original",
                                     "voice_hash": store.get(info.id).content_hash}
    assert {k: record[k] for k in ("id", "name", "created_at", "duration_s")} == \
        {k: v for k, v in dataclasses.asdict(info).items() if k != "variant"}


def test_a_real_clip_becomes_a_voice(store, front_end):
    path = Path(DATA_DIR, "sample-01.mp3")
    info = store.add(path.read_bytes())
    assert info.name is None and info.duration_s == pytest.approx(front_end.prepare(path).duration, abs=1e-3)
    assert store.get(info.id).t3_prompt_tokens.shape[1] > 0


def test_a_duplicate_upload_is_the_same_voice_and_keeps_the_first_name(store, front_end, monkeypatch):
    first = store.add(clip(), name="first")
    builds = []
    monkeypatch.setattr(front_end, "build", lambda *a, **k: builds.append(1))
    again = store.add(clip(), name="second")
    assert again == first and again.name == "first" and builds == []
    assert files(store.root) == voice_files(first.id)


def test_different_clips_are_different_voices(store):
    assert store.add(clip(seed=1)).id != store.add(clip(seed=2)).id
    assert len(store.list()) == 3  # two voices and default


def test_the_id_is_the_upload_alone_and_never_an_id_of_the_old_layout():
    data = clip()
    assert variant_family(get_variant("multilingual-v3")) == variant_family(get_variant("multilingual"))
    assert upload_hash(data) == upload_hash(bytes(data)) != upload_hash(clip(seed=1))
    assert all(upload_hash(data) != family_upload_hash(data, family) for family in ("original", "turbo", ""))


def upload_at_once(stores) -> list:
    """The same clip uploaded through every store at the same moment (one thread each)."""
    barrier, results = threading.Barrier(len(stores)), [None] * len(stores)

    def upload(i):
        barrier.wait()
        results[i] = stores[i].add(clip(), name=f"n{i}")

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_uploads_of_one_clip_by_two_stores_agree_on_one_voice(tmp_path, make_store):
    stores = [make_store(), make_store()]
    results = upload_at_once(stores)
    assert results[0] == results[1] == stores[0].info(results[0].id)
    assert files(tmp_path / "voices") == voice_files(results[0].id)


# ----------------------------------------------------------------------- several instances

def test_voices_persist_across_store_instances(store, make_store):
    info = store.add(clip(), name="Ada")
    voice = store.get(info.id)
    reopened = make_store()
    assert reopened.list()[1:] == [info]
    assert reopened.get(info.id).content_hash == voice.content_hash


def test_a_store_sees_a_voice_another_store_added_later(make_store):
    reader, writer = make_store(), make_store()
    assert reader.list()[1:] == []
    info = writer.add(clip())
    assert reader.info(info.id) == info
    assert reader.get(info.id).content_hash == writer.get(info.id).content_hash


def test_a_store_sees_a_voice_another_store_deleted(make_store):
    reader, writer = make_store(), make_store()
    info = writer.add(clip())
    reader.get(info.id)  # now cached by the reader
    assert writer.delete(info.id)
    with pytest.raises(UnknownVoiceError):
        reader.get(info.id)
    assert info.id not in reader.cached_ids()


# --------------------------------------------------------------------------------- delete

def test_delete_removes_the_files_and_the_cache_entry(store):
    info = store.add(clip())
    store.get(info.id)
    assert store.delete(info.id) is True
    assert files(store.root) == [] and store.cached_ids() == []
    with pytest.raises(UnknownVoiceError):
        store.get(info.id)
    assert store.delete(info.id) is False


def test_a_deleted_voice_can_be_uploaded_again(store):
    info = store.add(clip())
    store.delete(info.id)
    assert store.add(clip()).id == info.id and store.get(info.id) is not None


# -------------------------------------------------------------------------------- default

def test_default_is_the_builtin_voice_listed_first(store, builtin):
    store.add(clip())
    assert store.get(DEFAULT_VOICE_ID) is builtin
    first = store.list()[0]
    assert first.id == DEFAULT_VOICE_ID and first == store.info(DEFAULT_VOICE_ID)


def test_default_cannot_be_deleted(store):
    with pytest.raises(ReservedVoiceError, match="cannot be deleted") as err:
        store.delete(DEFAULT_VOICE_ID)
    assert err.value.code == "reserved_voice"


def test_without_a_builtin_voice_default_is_unknown(make_store):
    store = make_store(builtin=None)
    assert store.list() == []
    with pytest.raises(UnknownVoiceError, match="no built-in voice"):
        store.get(DEFAULT_VOICE_ID)


# ------------------------------------------------------------------------------------ ids

def test_an_unknown_id_raises_a_clear_key_error(store):
    with pytest.raises(KeyError) as err:
        store.get("0123456789abcdef")
    assert isinstance(err.value, UnknownVoiceError) and err.value.code == "unknown_voice"
    assert str(err.value) == "there is no voice '0123456789abcdef'"
    with pytest.raises(UnknownVoiceError):
        store.info("0123456789abcdef")


@pytest.mark.parametrize("bad", ["../victim", "..", "a/b", "/etc/passwd", "", ".hidden", "Upper", "x.json",
                                 "a" * 65, "nul\0", None, 7])
@pytest.mark.parametrize("method", ["get", "info", "delete"])
def test_malformed_ids_are_rejected_before_touching_files(store, tmp_path, bad, method):
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    (tmp_path / "victim.safetensors").write_text("x")
    with pytest.raises(InvalidVoiceIdError, match="is not a voice id"):
        getattr(store, method)(bad)
    assert victim.exists() and (tmp_path / "victim.safetensors").exists()


# -------------------------------------------------------------------------- bad uploads

def _rejected(store, data, code, **kwargs):
    with pytest.raises(VoiceUploadError) as err:
        store.add(data, **kwargs)
    assert err.value.code == code, err.value
    assert isinstance(err.value, ValueError)
    assert files(store.root) == []
    return err.value


def test_a_zero_length_upload_is_empty(store):
    _rejected(store, b"", "empty")


def test_audio_without_samples_is_empty(store):
    _rejected(store, clip(0.0), "empty")


def test_non_audio_is_invalid_audio(store):
    _rejected(store, b"this is not audio, only text " * 100, "invalid_audio")


def test_a_clip_with_a_corrupt_header_is_invalid_audio(store):
    data = bytearray(clip())
    data[20:36] = b"\xff" * 16  # the WAV 'fmt ' chunk
    _rejected(store, bytes(data), "invalid_audio")


def test_a_clip_with_corrupt_frames_is_invalid_audio(store):
    data = bytearray(clip(fmt="FLAC"))
    data[200:] = bytes(len(data) - 200)
    _rejected(store, bytes(data), "invalid_audio")


def test_a_truncated_wav_header_is_invalid_audio(store):
    _rejected(store, clip()[:30], "invalid_audio")


def test_a_too_large_upload_is_refused_before_decoding(make_store, front_end, monkeypatch):
    store = make_store(max_upload_bytes=1000)
    monkeypatch.setattr(front_end, "prepare", lambda *a, **k: pytest.fail("decoded"))
    err = _rejected(store, clip(), "too_large")
    assert "limit is 1000 bytes" in str(err)


def test_a_too_short_clip_is_refused(store):
    _rejected(store, clip(0.2), "too_short")


def test_a_clip_below_the_variants_minimum_is_too_short(tmp_path, turbo_front_end):
    turbo = VoiceStore(tmp_path / "voices", turbo_front_end, get_variant("turbo"), builtin=None)
    _rejected(turbo, clip(3.0), "too_short")


def test_a_silent_clip_is_refused(store):
    _rejected(store, clip(peak=1e-4), "silent")


def test_a_bad_name_is_refused(store):
    _rejected(store, clip(), "invalid_name", name="a\nb")
    _rejected(store, clip(), "invalid_name", name="x" * 129)


def test_the_store_refuses_voices_past_its_limit_but_not_duplicates(make_store):
    store = make_store(max_voices=1)
    info = store.add(clip(seed=1))
    with pytest.raises(VoiceUploadError) as err:
        store.add(clip(seed=2))
    assert err.value.code == "too_many_voices"
    assert store.add(clip(seed=1)) == info


def test_without_voice_models_adding_fails_and_reading_works(make_store):
    info = make_store().add(clip())
    store = make_store(front_end=None)
    with pytest.raises(VoiceStoreError) as err:
        store.add(clip(seed=3))
    assert err.value.code == "voice_models_not_loaded"
    assert store.get(info.id) is not None


def test_an_interrupted_write_leaves_no_voice(store, monkeypatch):
    def crash(self, path):
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Voice, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        store.add(clip())
    assert files(store.root) == [] and store.list()[1:] == []
    monkeypatch.undo()
    assert store.get(store.add(clip()).id) is not None


# ---------------------------------------------------------------------------------- cache

def test_the_cache_is_bounded_and_reloads_evicted_voices_from_disk(make_store, monkeypatch):
    store = make_store(cache_size=2)
    a, b, c = (store.add(clip(seed=s)).id for s in range(3))
    assert store.cached_ids() == [b, c]
    loads = []
    real_load = Voice.load
    monkeypatch.setattr(Voice, "load", classmethod(lambda cls, path: loads.append(path) or real_load(path)))
    store.get(b)  # a hit: no load, b becomes the most recent
    assert loads == [] and store.cached_ids() == [c, b]
    assert store.get(a).name == a and len(loads) == 1  # a miss: loaded from disk, c evicted
    assert store.cached_ids() == [b, a]


def test_a_zero_size_cache_holds_nothing(make_store):
    store = make_store(cache_size=0)
    info = store.add(clip())
    assert store.get(info.id) is not None and store.cached_ids() == []


# -------------------------------------------------------------------------------- startup

def test_startup_skips_leftovers_and_bad_files_with_warnings(make_store, tmp_path, caplog):
    good = make_store().add(clip())
    root = tmp_path / "voices"
    (root / f".{good.id}.json.tmp-1-deadbeef").write_text("{half")
    old = root / ".0000000000000001.safetensors.tmp-1-cafe"
    old.write_bytes(b"half")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    (root / "00000000000000aa.json").write_text(json.dumps({"format": "chorus-voice-record/1"}))
    (root / "00000000000000bb.json").write_text("{not json")
    (root / "00000000000000cc.safetensors").write_bytes(b"no record")
    (root / "00000000000000ce.clip").write_bytes(b"no record")
    (root / "00000000000000cf.turbo.safetensors").write_bytes(b"no record")
    (root / "00000000000000dd.json").write_text(json.dumps({  # an old-layout record without its voice file
        "format": "chorus-voice-record/1", "id": "00000000000000dd", "name": None, "created_at": 1.0,
        "duration_s": 1.0, "variant": "original", "family": "original", "content_hash": "00000000000000dd" * 4,
        "voice_hash": "0" * 32, "bytes": 1}))
    with caplog.at_level(logging.WARNING, logger="chorus.voices.store"):
        store = make_store()
    assert [i.id for i in store.list()] == [DEFAULT_VOICE_ID, good.id]
    assert not old.exists() and (root / f".{good.id}.json.tmp-1-deadbeef").exists()  # fresh: maybe in progress
    for name in ("00000000000000aa.json", "00000000000000bb.json", "00000000000000cc.safetensors",
                 "00000000000000ce.clip", "00000000000000cf.turbo.safetensors", "00000000000000dd.json",
                 "tmp-1-deadbeef", "removed"):
        assert name in caplog.text
    with pytest.raises(UnknownVoiceError):
        store.get("00000000000000dd")


def test_bad_files_are_warned_about_once(make_store, tmp_path, caplog):
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "00000000000000bb.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="chorus.voices.store"):
        store = make_store()
        store.list()
        store.list()
    assert caplog.text.count("00000000000000bb.json") == 1
