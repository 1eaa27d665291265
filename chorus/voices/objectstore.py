"""A voice store in an object store (``s3://bucket/prefix``, ``gs://``, ``az://``, any fsspec
URL), with a local directory caching the voice files this process uses.

Opened by :func:`open_blob_store`; the store above it (:class:`~chorus.voices.store.VoiceStore`)
is the same as for a directory. What the object store holds is what a directory would hold
(records, clips and voice files: :mod:`chorus.voices.layout`) under the URL's prefix. Each
replica keeps the voice files it loaded or wrote in its local directory; voice files are built
from content-addressed clips, so a cached copy never goes stale, and records and clips are
always read from the object store.

Deletions reach other replicas through :meth:`CachedObjectStore.exists`: a voice held in a
replica's memory is re-checked against the object store at most every ``recheck_s`` seconds
(:data:`RECHECK_S` by default), so a voice deleted through one replica is refused by every other
within that bound. Everything else (``get`` of a voice not in memory, ``info``, ``list``,
``delete``) asks the object store each time.
"""
from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from chorus.voices.blobs import Blobs, BlobStore, DirectoryBlobs, Stamp
from chorus.voices.records import VoiceStoreError

logger = logging.getLogger(__name__)

RECHECK_S = 5.0
_LOCAL_PROTOCOLS = ("file", "local")
# Keys of an fsspec info dict that change with an object's content, most specific first.
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "mtime", "LastModified", "last_modified", "updated",
                 "created")


class StoreUnavailableError(VoiceStoreError):
    """The object store did not answer (network, credentials, permissions, a missing bucket).
    Code ``voice_store_unavailable``."""

    code = "voice_store_unavailable"


def check_voices_url(url: str) -> None:
    """Raise ValueError unless ``url`` names an object store this process can open: a URL with a
    protocol that fsspec knows and whose package is installed. Nothing is contacted."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"voices_url must be a URL such as s3://bucket/prefix, got {url!r}; "
                         "for a local directory use voices_dir")
    try:
        import fsspec
    except ImportError:
        raise ValueError(f"voices_url {url!r} needs fsspec: pip install 'chorus-tts[objectstore]'") from None
    from fsspec.registry import known_implementations

    for part in url.split("::"):  # fsspec's chained URLs, e.g. simplecache::s3://...
        protocol = part.split("://", 1)[0] if "://" in part else part
        try:
            fsspec.get_filesystem_class(protocol)
        except ValueError:
            raise ValueError(f"voices_url {url!r}: fsspec knows no {protocol!r} protocol (e.g. s3, gs, az, "
                             "file, memory)") from None
        except ImportError as exc:
            package = known_implementations.get(protocol, {}).get("class", protocol).split(".")[0]
            raise ValueError(f"voices_url {url!r}: the {protocol!r} protocol needs the {package} package: "
                             f"pip install {package} ({exc})") from None


def open_blob_store(voices_dir: str | os.PathLike, voices_url: str | None = None, *,
                    recheck_s: float = RECHECK_S, storage_options: Mapping[str, Any] | None = None) -> BlobStore:
    """The files of a voice store: the directory ``voices_dir`` when there is no URL, else the
    object store at ``voices_url`` with ``voices_dir`` as this process's cache. ``storage_options``
    go to the fsspec file system (credentials and endpoints usually come from the backend's own
    environment variables and files instead)."""
    if voices_url is None:
        return DirectoryBlobs(voices_dir)
    remote = open_object_store(voices_url, storage_options)
    if isinstance(remote, DirectoryBlobs) and remote.root.resolve() == Path(voices_dir).resolve():
        return remote  # the URL names voices_dir itself: a cache of it would be the store
    return CachedObjectStore(remote, DirectoryBlobs(voices_dir), recheck_s=recheck_s)


def open_object_store(url: str, storage_options: Mapping[str, Any] | None = None) -> Blobs:
    """The object store at ``url``: a ``file://`` URL is a directory (with its atomic writes and
    hard-link publish, which fsspec's local files lack), anything else goes through fsspec."""
    check_voices_url(url)
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url, **dict(storage_options or {}))
    if "::" not in url and url.split("://", 1)[0] in _LOCAL_PROTOCOLS:
        return DirectoryBlobs(path)
    return FsspecBlobs(fs, path, url)


def _stamp(info: Mapping[str, Any]) -> Stamp:
    version = next((info[k] for k in _VERSION_KEYS if info.get(k) is not None), None)
    if isinstance(version, datetime.datetime):  # listings and info may differ in type
        version = version.timestamp()
    return info.get("size"), version


class FsspecBlobs:
    """:class:`~chorus.voices.blobs.Blobs` in an fsspec file system under one prefix.

    Objects are written whole, so a reader sees an old object or a new one. :meth:`create` uses
    fsspec's exclusive write (``pipe_file(mode="create")``: s3fs sends ``If-None-Match: *``);
    a backend without one overwrites, which is benign here (see docs/voices.md). Failures other
    than a missing or existing object raise :class:`StoreUnavailableError`.
    """

    def __init__(self, fs, root: str, location: str):
        self._fs = fs
        self._root = root.rstrip("/")
        self.location = location

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}"

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        try:
            self._fs.invalidate_cache(self._root)  # fsspec may answer from an old listing
            return fn(*args, **kwargs)
        except (FileNotFoundError, FileExistsError):
            raise
        except Exception as exc:
            raise StoreUnavailableError(f"the voice store {self.location} failed to {what}: "
                                        f"{type(exc).__name__}: {exc}") from exc

    def listing(self) -> dict[str, Stamp]:
        try:
            entries = self._call("list its files", self._fs.ls, self._root, detail=True)
        except FileNotFoundError:
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: _stamp(e) for e in entries if e.get("type") != "directory"}

    def stamp(self, name: str) -> Stamp | None:
        try:
            info = self._call(f"look up {name}", self._fs.info, self._path(name))
        except FileNotFoundError:
            return None
        return None if info.get("type") == "directory" else _stamp(info)

    def read(self, name: str) -> bytes:
        return self._call(f"read {name}", self._fs.cat_file, self._path(name))

    def write(self, name: str, data: bytes) -> None:
        self._put(name, data, "overwrite")

    def create(self, name: str, data: bytes) -> bool:
        try:
            self._put(name, data, "create")
        except FileExistsError:
            return False
        return True

    def _put(self, name: str, data: bytes, mode: str) -> None:
        try:
            self._call(f"write {name}", self._fs.pipe_file, self._path(name), data, mode=mode)
        except FileNotFoundError as exc:  # no such bucket or container
            raise StoreUnavailableError(f"the voice store {self.location} failed to write {name}: its bucket "
                                        f"or container does not exist ({exc})") from exc

    def delete(self, *names: str) -> bool:
        removed = False
        for name in names:
            if self.stamp(name) is None:  # object stores delete missing keys without a word
                continue
            try:
                self._call(f"delete {name}", self._fs.rm_file, self._path(name))
                removed = True
            except FileNotFoundError:
                pass
        return removed

    def __repr__(self) -> str:
        return f"FsspecBlobs({self.location!r})"


class CachedObjectStore:
    """:class:`~chorus.voices.blobs.BlobStore` over an object store (``remote``), with voice files
    cached in a local directory (``cache``). Records are never cached on disk."""

    def __init__(self, remote: Blobs, cache: DirectoryBlobs, *, recheck_s: float = RECHECK_S):
        if recheck_s < 0:
            raise ValueError(f"recheck_s must be >= 0, got {recheck_s}")
        self.remote = remote
        self.cache = cache
        self.root = cache.root
        self.location = remote.location
        self.recheck_s = recheck_s
        self._seen: dict[str, float] = {}  # name -> when the object store last said it exists
        self._lock = threading.Lock()

    def _saw(self, name: str, exists: bool) -> None:
        with self._lock:
            if exists:
                self._seen[name] = time.monotonic()
            else:
                self._seen.pop(name, None)

    def listing(self) -> dict[str, Stamp]:
        return self.remote.listing()

    def stamp(self, name: str) -> Stamp | None:
        stamp = self.remote.stamp(name)
        self._saw(name, stamp is not None)
        return stamp

    def exists(self, name: str) -> bool:
        with self._lock:
            seen = self._seen.get(name)
        if seen is not None and time.monotonic() - seen < self.recheck_s:
            return True
        return self.stamp(name) is not None

    def read(self, name: str) -> bytes:
        return self.remote.read(name)

    def local_file(self, name: str) -> Path:
        path = self.cache.local_file(name)
        if not path.is_file():
            self.cache.write(name, self.remote.read(name))  # FileNotFoundError when it is gone
        return path

    def write_file(self, name: str, fill: Callable[[Path], object]) -> None:
        self.cache.write_file(name, fill)
        try:
            self.remote.write(name, self.cache.read(name))
        except BaseException:
            self.cache.delete(name)  # keep no copy of what the object store does not hold
            raise

    def write(self, name: str, data: bytes) -> None:
        self.remote.write(name, data)
        self._saw(name, True)

    def create(self, name: str, data: bytes) -> bool:
        created = self.remote.create(name, data)
        self._saw(name, True)
        return created

    def delete(self, *names: str) -> bool:
        removed = self.remote.delete(*names)
        self.uncache(*names)
        return removed

    def uncache(self, *names: str) -> None:
        self.cache.delete(*names)
        for name in names:
            self._saw(name, False)

    def sweep(self) -> None:
        self.cache.sweep()

    def __repr__(self) -> str:
        return f"CachedObjectStore({self.location!r}, cache={str(self.root)!r})"
