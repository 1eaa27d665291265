"""The voice store over real S3 HTTP calls: s3fs against a moto S3 server run as a subprocess on
loopback, configured the way docs/voices.md tells (AWS_* environment variables). Skipped when
s3fs or moto's server (moto, flask, flask-cors) is not installed."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid

import pytest

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server", reason="moto's S3 server needs moto, flask and flask-cors")

import fsspec  # noqa: E402

from chorus.voices.objectstore import StoreUnavailableError, open_blob_store, open_object_store  # noqa: E402
from chorus.voices.store import UnknownVoiceError, VoiceStore  # noqa: E402
from tests.voices.test_store import (  # noqa: E402,F401 (fixtures)
    ORIGINAL, builtin, clip, files, front_end, upload_at_once, voice_files,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, "the moto server exited"
                assert time.monotonic() < deadline, "the moto server did not start"
                time.sleep(0.1)
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
                env.delenv(name, raising=False)
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            env.setenv("AWS_DEFAULT_REGION", "us-east-1")
            env.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
            s3fs.S3FileSystem.clear_instance_cache()
            yield
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.terminate()
        server.wait(10)


@pytest.fixture
def url(s3_server):
    bucket = f"chorus-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3").mkdir(bucket)
    return f"s3://{bucket}/voices"


@pytest.fixture
def replica(tmp_path, url, front_end, builtin):
    def make(name: str, *, recheck_s: float = 0.0, **kwargs) -> VoiceStore:
        return VoiceStore(open_blob_store(tmp_path / name, url, recheck_s=recheck_s), front_end, ORIGINAL,
                          builtin=builtin, max_upload_bytes=1 << 20, **kwargs)

    return make


def test_replicas_share_voices_through_s3(replica, url):
    a, b = replica("a"), replica("b")
    info = a.add(clip(), name="Ada")
    assert sorted(open_object_store(url).listing()) == voice_files(info.id)
    assert b.list()[1:] == [info]
    assert b.get(info.id).content_hash == a.get(info.id).content_hash
    assert a.delete(info.id)
    with pytest.raises(UnknownVoiceError):
        b.get(info.id)
    assert files(b.root) == [] and open_object_store(url).listing() == {}


def test_s3_refuses_a_second_record_of_one_id(url):
    blobs = open_object_store(url)
    assert blobs.create("0000000000000001.json", b"first") is True
    assert blobs.create("0000000000000001.json", b"second") is False  # If-None-Match: *
    assert blobs.read("0000000000000001.json") == b"first"


def test_concurrent_uploads_through_two_replicas_give_one_record(replica, url):
    stores = [replica("a"), replica("b")]
    results = upload_at_once(stores)
    assert results[0] == results[1] == stores[1].info(results[0].id)


def test_a_missing_bucket_is_a_clear_error(s3_server, tmp_path, front_end):
    url = f"s3://chorus-missing-{uuid.uuid4().hex[:12]}/voices"
    store = VoiceStore(open_blob_store(tmp_path / "a", url), front_end, ORIGINAL, builtin=None)
    assert store.list() == []
    with pytest.raises(StoreUnavailableError, match="bucket or container does not exist") as err:
        store.add(clip())
    assert err.value.code == "voice_store_unavailable"
    assert files(tmp_path / "a") == []  # no cached copy of what the object store does not hold
