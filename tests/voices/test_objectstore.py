"""The voice store over an object-store URL: replicas (store instances with their own cache
directories) sharing one URL. ``file://`` URLs go through the directory code behind the cache,
``memory://`` through fsspec; both are real I/O (fsspec's in-process memory file system is the
object store)."""
from __future__ import annotations

import time
import uuid

import fsspec
import pytest

from chorus.voices.objectstore import (
    CachedObjectStore, FsspecBlobs, check_voices_url, open_blob_store, open_object_store,
)
from chorus.voices.store import UnknownVoiceError, VoiceStore, VoiceStoreError
from tests.voices.test_store import (  # noqa: F401 (fixtures)
    ORIGINAL, builtin, clip, files, front_end, upload_at_once, voice_files,
)


@pytest.fixture(params=["file", "memory"])
def url(request, tmp_path):
    if request.param == "file":
        yield f"file://{tmp_path}/bucket/voices"
        return
    path = f"/chorus-test-{uuid.uuid4().hex}/voices"
    yield f"memory://{path}"
    fs = fsspec.filesystem("memory")
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture
def replica(tmp_path, url, front_end, builtin):
    """``replica(name)``: a store over ``url`` caching in its own directory ``tmp_path/name``."""

    def make(name: str, *, recheck_s: float = 0.0, **kwargs) -> VoiceStore:
        files_ = open_blob_store(tmp_path / name, url, recheck_s=recheck_s)
        kwargs.setdefault("builtin", builtin)
        return VoiceStore(files_, kwargs.pop("front_end", front_end), ORIGINAL, max_upload_bytes=1 << 20, **kwargs)

    return make


def remote_names(url: str) -> list[str]:
    return sorted(open_object_store(url).listing())


# ----------------------------------------------------------------------------------- opening

def test_a_file_url_is_a_directory_and_other_urls_go_through_fsspec(tmp_path):
    assert not isinstance(open_object_store(f"file://{tmp_path}/v"), FsspecBlobs)
    assert (tmp_path / "v").is_dir()
    assert isinstance(open_object_store("memory://chorus-test/v"), FsspecBlobs)
    assert isinstance(open_blob_store(tmp_path / "cache", "memory://chorus-test/v"), CachedObjectStore)


def test_a_file_url_naming_the_cache_directory_is_that_directory_alone(tmp_path):
    files_ = open_blob_store(tmp_path / "voices", f"file://{tmp_path}/voices")
    assert not isinstance(files_, CachedObjectStore) and files_.root == tmp_path / "voices"


def test_a_url_without_a_protocol_is_refused():
    with pytest.raises(ValueError, match="must be a URL such as s3://bucket/prefix.*use voices_dir"):
        check_voices_url("/shared/voices")


def test_an_unknown_protocol_is_refused_naming_it():
    with pytest.raises(ValueError, match="fsspec knows no 'nope' protocol"):
        check_voices_url("nope://bucket/voices")


def test_a_protocol_whose_package_is_missing_names_the_package():
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="the 'gs' protocol needs the gcsfs package: pip install gcsfs"):
        check_voices_url("gs://bucket/voices")


# ---------------------------------------------------------------------------- one replica

def test_a_voice_round_trips_through_the_object_store(replica, url):
    store = replica("a")
    info = store.add(clip(), name="Ada")
    assert store.info(info.id) == info and store.list()[1:] == [info]
    assert store.get(info.id).name == "Ada"
    assert remote_names(url) == voice_files(info.id)
    assert files(store.root) == [f"{info.id}.original.safetensors"]  # the cache holds voice files only


def test_a_duplicate_upload_keeps_the_first_record(replica, url):
    store = replica("a")
    first = store.add(clip(), name="first")
    assert store.add(clip(), name="second") == first
    assert remote_names(url) == voice_files(first.id)


def test_the_first_record_created_wins(url):
    blobs = open_object_store(url)
    assert blobs.create("0000000000000001.json", b"first") is True
    assert blobs.create("0000000000000001.json", b"second") is False
    assert blobs.read("0000000000000001.json") == b"first"


def test_delete_removes_the_voice_from_the_object_store_and_the_cache(replica, url):
    store = replica("a")
    info = store.add(clip())
    assert store.delete(info.id) is True
    assert remote_names(url) == [] and files(store.root) == [] and store.cached_ids() == []
    with pytest.raises(UnknownVoiceError):
        store.get(info.id)
    assert store.delete(info.id) is False


# ------------------------------------------------------------------------ several replicas

def test_a_voice_uploaded_through_one_replica_is_served_by_another(replica):
    a, b = replica("a"), replica("b")
    info = a.add(clip(), name="Ada")
    assert b.list()[1:] == [info] and b.info(info.id) == info
    assert files(b.root) == []
    assert b.get(info.id).content_hash == a.get(info.id).content_hash
    assert files(b.root) == [f"{info.id}.original.safetensors"]  # fetched once, then cached


def test_a_cached_voice_file_is_used_without_fetching_it_again(replica, url, monkeypatch):
    a, b = replica("a"), replica("b", cache_size=0)
    info = a.add(clip())
    b.get(info.id)
    reads = []
    real_read = b.files.remote.read
    monkeypatch.setattr(b.files.remote, "read", lambda name: reads.append(name) or real_read(name))
    b.get(info.id)
    assert f"{info.id}.original.safetensors" not in reads


def test_a_delete_through_one_replica_reaches_another_within_the_recheck_bound(replica):
    bound = 0.5
    a, b = replica("a"), replica("b", recheck_s=bound)
    info = a.add(clip())
    b.get(info.id)  # now in b's memory and its cache directory
    assert a.delete(info.id)
    deleted = time.monotonic()
    while True:
        asked = time.monotonic()  # read before the call: a slow machine must not turn a pause into a failure
        try:
            b.get(info.id)
        except UnknownVoiceError:
            break
        assert asked - deleted < bound, "a deleted voice was served past the recheck bound"
        time.sleep(0.02)
    assert b.cached_ids() == [] and files(b.root) == []
    with pytest.raises(UnknownVoiceError):
        b.info(info.id)
    assert b.list()[1:] == []


def test_without_a_recheck_bound_a_delete_reaches_another_replica_at_once(replica):
    a, b = replica("a"), replica("b", recheck_s=0.0)
    info = a.add(clip())
    b.get(info.id)
    a.delete(info.id)
    with pytest.raises(UnknownVoiceError):
        b.get(info.id)


def test_concurrent_uploads_of_one_clip_through_two_replicas_give_one_voice(replica, url):
    stores = [replica("a"), replica("b")]
    results = upload_at_once(stores)
    assert results[0] == results[1] == stores[0].info(results[0].id) == stores[1].info(results[0].id)
    assert remote_names(url) == voice_files(results[0].id)


# ------------------------------------------------------------------------- damaged objects

def test_a_corrupt_voice_object_is_a_damaged_voice(replica, url):
    a, b = replica("a"), replica("b")
    info = a.add(clip())
    open_object_store(url).write(f"{info.id}.original.safetensors", b"not a voice file")
    with pytest.raises(VoiceStoreError, match="is damaged in .*upload its clip again") as err:
        b.get(info.id)
    assert err.value.code == "damaged_voice"
    assert files(b.root) == []  # the bad copy is not kept


def test_a_missing_voice_object_is_built_again_from_the_clip(replica, url):
    a, b = replica("a"), replica("b")
    info = a.add(clip())
    open_object_store(url).delete(f"{info.id}.original.safetensors")
    assert b.get(info.id).content_hash == a.get(info.id).content_hash
    assert remote_names(url) == voice_files(info.id)


def test_a_missing_record_makes_the_voice_unknown(replica, url):
    a, b = replica("a"), replica("b")
    info = a.add(clip())
    open_object_store(url).delete(f"{info.id}.json")
    with pytest.raises(UnknownVoiceError, match="there is no voice"):
        b.get(info.id)
    assert b.list()[1:] == []


def test_a_corrupt_record_is_skipped_with_a_warning(replica, url, caplog):
    a = replica("a")
    info = a.add(clip())
    open_object_store(url).write(f"{info.id}.json", b"{not json")
    b = replica("b")
    assert b.list()[1:] == [] and f"{info.id}.json is unreadable" in caplog.text
    with pytest.raises(UnknownVoiceError):
        b.get(info.id)


# --------------------------------------------------------------------------- several families

def test_a_voice_uploaded_for_one_family_is_built_for_another_through_the_object_store(tmp_path, url, front_end):
    from chorus.models.variants import get_variant
    from tests.voices.front_ends import tiny_front_end

    turbo = VoiceStore(open_blob_store(tmp_path / "t", url, recheck_s=0.0), tiny_front_end(get_variant("turbo")),
                       get_variant("turbo"), builtin=None)
    original = VoiceStore(open_blob_store(tmp_path / "o", url, recheck_s=0.0), front_end, ORIGINAL, builtin=None)
    info = turbo.add(clip(6.0))
    assert original.get(info.id).content_hash == front_end.build(clip(6.0)).content_hash
    assert remote_names(url) == voice_files(info.id, "original", "turbo")
    assert files(original.root) == [f"{info.id}.original.safetensors"]  # the clip is read, never cached
    assert original.delete(info.id) and remote_names(url) == [] and files(original.root) == []
