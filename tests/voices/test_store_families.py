"""One voice for every model: stores of two variant families (Turbo and the original) over one
directory, the clip kept once and each family's voice built from it on first use; and voices of
the old layout (one family each), which stay with their family.

Builds are counted by a real front end that counts its calls (``CountingFrontEnd``); the models
are the shrunken ones of the other store tests.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from chorus.models.variants import get_variant
from chorus.voices import Voice, VoiceFrontEnd
from chorus.voices.blobs import DirectoryBlobs
from chorus.voices.records import LEGACY_METADATA_FORMAT, family_upload_hash, parse_record
from chorus.voices.store import (
    ID_HEX_CHARS, UnknownVoiceError, VoiceStore, VoiceStoreError, VoiceUploadError, variant_family,
)
from tests.voices.front_ends import ORIGINAL, CountingFrontEnd, tiny_front_end
from tests.voices.test_store import clip, files, voice_files

TURBO = get_variant("turbo")
SIX_SECONDS = clip(6.0)  # long enough for every family (Turbo needs more than 5 s)


@pytest.fixture(scope="module")
def original_models() -> VoiceFrontEnd:
    return tiny_front_end(ORIGINAL)


@pytest.fixture(scope="module")
def turbo_models() -> VoiceFrontEnd:
    return tiny_front_end(TURBO)


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "voices"


@pytest.fixture
def original(root, original_models) -> VoiceStore:
    return VoiceStore(root, CountingFrontEnd(original_models), ORIGINAL, builtin=None)


@pytest.fixture
def turbo(root, turbo_models) -> VoiceStore:
    return VoiceStore(root, CountingFrontEnd(turbo_models), TURBO, builtin=None)


def write_old_voice(root: Path, front_end: VoiceFrontEnd, data: bytes, *, name: str | None = None) -> str:
    """A voice as stores wrote them before one voice served every family: a format-1 record and
    ``<id>.safetensors``, the id hashing the clip and the family. Returns its id."""
    family = variant_family(front_end.variant)
    digest = family_upload_hash(data, family)
    voice_id = digest[:ID_HEX_CHARS]
    reference = front_end.prepare(data)
    voice = front_end.build(reference, name=name or voice_id)
    root.mkdir(parents=True, exist_ok=True)
    voice.save(root / f"{voice_id}.safetensors")
    record = {"format": LEGACY_METADATA_FORMAT, "id": voice_id, "name": name, "created_at": time.time(),
              "duration_s": round(reference.duration, 3), "variant": front_end.variant.name, "family": family,
              "content_hash": digest, "voice_hash": voice.content_hash, "bytes": len(data)}
    (root / f"{voice_id}.json").write_text(json.dumps(record, indent=1))
    return voice_id


# --------------------------------------------------------------------------- one id, two families

def test_a_voice_uploaded_through_one_family_is_built_for_another_on_first_use(turbo, original, original_models):
    info = turbo.add(SIX_SECONDS, name="Ada")
    assert original.front_end.builds == 0
    voice = original.get(info.id)
    assert original.front_end.builds == 1
    assert voice.variant == "original" and voice.name == "Ada"
    assert voice.content_hash == original_models.build(SIX_SECONDS).content_hash
    assert files(original.root) == voice_files(info.id, "original", "turbo")


def test_a_voice_built_for_a_family_is_kept_and_not_built_again(root, turbo, original_models):
    info = turbo.add(SIX_SECONDS)
    first = VoiceStore(root, CountingFrontEnd(original_models), ORIGINAL, builtin=None, cache_size=0)
    built = first.get(info.id)
    assert first.get(info.id).content_hash == built.content_hash  # no cache: read from the file
    assert first.front_end.builds == 1
    later = VoiceStore(root, CountingFrontEnd(original_models), ORIGINAL, builtin=None)
    assert later.get(info.id).content_hash == built.content_hash and later.front_end.builds == 0


def test_every_family_lists_a_voice_as_its_own(turbo, original):
    info = turbo.add(SIX_SECONDS, name="Ada")
    assert info.variant == "turbo"
    seen = original.info(info.id)
    assert original.list() == [seen] and seen.variant == "original"
    assert (seen.id, seen.name, seen.created_at, seen.duration_s) == (info.id, "Ada", info.created_at,
                                                                      info.duration_s)
    assert original.front_end.builds == 0  # listing builds nothing


def test_the_same_clip_uploaded_through_another_family_is_the_same_voice_built_once(turbo, original):
    first = turbo.add(SIX_SECONDS, name="first")
    again = original.add(SIX_SECONDS, name="second")
    assert again.id == first.id and again.name == "first" and again.variant == "original"
    assert original.front_end.prepares == original.front_end.builds == 0  # a duplicate is not built
    assert original.get(first.id).variant == "original" and original.front_end.builds == 1


def test_concurrent_first_use_builds_in_two_stores_end_with_one_whole_file(root, turbo, original_models):
    info = turbo.add(SIX_SECONDS)
    barrier = threading.Barrier(2)  # both builds run at once: neither finds the other's file
    stores = [VoiceStore(root, CountingFrontEnd(original_models, barrier=barrier), ORIGINAL, builtin=None)
              for _ in range(2)]
    voices: list[Voice | BaseException | None] = [None, None]

    def first_use(i: int) -> None:
        try:
            voices[i] = stores[i].get(info.id)
        except BaseException as exc:  # reported below
            voices[i] = exc

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(v, Voice) for v in voices), voices
    assert [s.front_end.builds for s in stores] == [1, 1]
    assert files(root) == voice_files(info.id, "original", "turbo")  # one file, no temporaries
    on_disk = Voice.load(root / f"{info.id}.original.safetensors")
    assert voices[0].content_hash == voices[1].content_hash == on_disk.content_hash


# ------------------------------------------------------------------------------ clear refusals

def test_without_voice_models_a_voice_not_built_for_the_family_is_a_clear_error(root, turbo):
    info = turbo.add(SIX_SECONDS)
    reader = VoiceStore(root, None, ORIGINAL, builtin=None)
    with pytest.raises(VoiceStoreError, match=f"voice '{info.id}' has not been built for the original models "
                                              "yet.*voice models are not loaded") as err:
        reader.get(info.id)
    assert err.value.code == "voice_models_not_loaded"
    assert reader.info(info.id).id == info.id and files(root) == voice_files(info.id, "turbo")


def test_without_voice_models_a_voice_built_for_the_family_is_served(root, turbo, original):
    info = turbo.add(SIX_SECONDS)
    built = original.get(info.id)
    reader = VoiceStore(root, None, ORIGINAL, builtin=None)
    assert reader.get(info.id).content_hash == built.content_hash


def test_a_clip_this_family_refuses_is_a_clear_error_naming_the_voice(original, turbo):
    info = original.add(clip(3.0))  # enough for the original, too short for Turbo
    assert turbo.list() == [turbo.info(info.id)]
    with pytest.raises(VoiceStoreError, match=f"voice '{info.id}' cannot be used with the turbo variant: "
                                              "the reference clip is 3.00 s long; the turbo variant needs "
                                              "more than 5 s") as err:
        turbo.get(info.id)
    assert err.value.code == "unusable_clip" and not isinstance(err.value, UnknownVoiceError)
    assert files(turbo.root) == voice_files(info.id, "original")  # nothing written for Turbo


def test_a_refused_clip_is_not_decoded_again(original, turbo):
    info = original.add(clip(3.0))
    for _ in range(3):
        with pytest.raises(VoiceStoreError, match="cannot be used with the turbo variant"):
            turbo.get(info.id)
    assert turbo.front_end.prepares == 1


def test_a_lost_clip_is_a_damaged_voice_for_families_that_have_not_built_it(root, turbo, original):
    info = turbo.add(SIX_SECONDS)
    (root / f"{info.id}.clip").unlink()
    assert turbo.get(info.id).variant == "turbo"  # built already: still served
    with pytest.raises(VoiceStoreError, match=f"its clip {info.id}.clip is missing.*upload its clip again") as err:
        original.get(info.id)
    assert err.value.code == "damaged_voice"


# --------------------------------------------------------------------------- delete, failures

def test_delete_removes_the_record_the_clip_and_every_family_file(root, turbo, original):
    info = turbo.add(SIX_SECONDS)
    original.get(info.id)
    assert original.delete(info.id) is True
    assert files(root) == [] and original.cached_ids() == []
    for store in (turbo, original):
        with pytest.raises(UnknownVoiceError):
            store.get(info.id)
    assert turbo.delete(info.id) is False


def test_a_voice_whose_record_is_gone_is_invisible_and_an_upload_completes_it(root, turbo, original):
    info = turbo.add(SIX_SECONDS)
    original.get(info.id)
    (root / f"{info.id}.json").unlink()  # a delete interrupted after its first step
    for store in (turbo, original):
        assert store.list() == []
        with pytest.raises(UnknownVoiceError):
            store.get(info.id)
    assert original.add(SIX_SECONDS).id == info.id
    assert turbo.get(info.id).variant == "turbo" and turbo.front_end.builds == 1  # the file was still there


def test_a_failed_upload_leaves_nothing(root, turbo):
    with pytest.raises(VoiceUploadError) as err:
        turbo.add(clip(3.0))
    assert err.value.code == "too_short"
    assert files(root) == [] and turbo.list() == []


class RecordsDoNotFit(DirectoryBlobs):
    """A directory whose disk fills up just before the record: a real clip and voice file are
    written, then publishing fails as a full disk does."""

    def create(self, name, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.root / name))


def test_an_upload_that_does_not_fit_leaves_nothing(root, turbo_models):
    store = VoiceStore(RecordsDoNotFit(root), turbo_models, TURBO, builtin=None)
    with pytest.raises(VoiceStoreError, match="out of space.*nothing was stored") as err:
        store.add(SIX_SECONDS)
    assert err.value.code == "insufficient_storage"
    assert files(root) == [] and store.list() == []


# ------------------------------------------------------------------------------- the old layout

def test_an_old_layout_voice_is_served_by_its_family_as_before(root, original_models, original):
    voice_id = write_old_voice(root, original_models, clip(), name="Old")
    info = original.info(voice_id)
    assert (info.name, info.variant) == ("Old", "original") and original.list() == [info]
    assert original.get(voice_id).content_hash == original_models.build(clip()).content_hash
    assert original.front_end.prepares == original.front_end.builds == 0


def test_an_old_layout_voice_is_invisible_to_other_families(root, original_models, turbo):
    voice_id = write_old_voice(root, original_models, SIX_SECONDS)
    assert turbo.list() == []
    for method in (turbo.get, turbo.info):
        with pytest.raises(UnknownVoiceError, match="built for the original variant; this server runs turbo"):
            method(voice_id)
    assert turbo.delete(voice_id) is False and files(root) == [f"{voice_id}.json", f"{voice_id}.safetensors"]


def test_uploading_an_old_layout_voices_clip_again_makes_a_new_voice(root, original_models, original):
    old_id = write_old_voice(root, original_models, SIX_SECONDS)
    info = original.add(SIX_SECONDS)
    assert info.id != old_id and sorted(i.id for i in original.list()) == sorted([old_id, info.id])


def test_delete_removes_an_old_layout_voice(root, original_models, original):
    voice_id = write_old_voice(root, original_models, clip())
    assert original.delete(voice_id) is True and files(root) == []


def test_records_of_both_formats_parse(root, original_models, original):
    old_id = write_old_voice(root, original_models, clip(seed=1))
    new_id = original.add(clip(seed=2)).id
    old = parse_record((root / f"{old_id}.json").read_bytes(), old_id, stamp=None)
    new = parse_record((root / f"{new_id}.json").read_bytes(), new_id, stamp=None)
    assert (old.family, old.keeps_clip, old.info.variant) == ("original", False, "original")
    assert (new.family, new.keeps_clip, new.info.variant) == (None, True, "original")
    with pytest.raises(ValueError, match="not a voice record format"):
        parse_record(json.dumps({"format": "chorus-voice-record/9", "id": new_id}).encode(), new_id, stamp=None)


class VoiceFilesDoNotFit(DirectoryBlobs):
    """A directory that has room for records and clips but no longer for voice files."""

    def write_file(self, name, fill):
        if name.endswith(".safetensors"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.root / name))
        super().write_file(name, fill)


def test_a_first_use_build_that_does_not_fit_is_served_from_memory(root, turbo, original_models, caplog):
    info = turbo.add(SIX_SECONDS)
    full = VoiceStore(VoiceFilesDoNotFit(root), original_models, ORIGINAL, builtin=None)
    assert full.get(info.id).variant == "original" and full.cached_ids() == [info.id]
    assert files(root) == voice_files(info.id, "turbo") and "served from memory" in caplog.text
