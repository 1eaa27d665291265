"""Where a voice store keeps its files: the seam between :class:`~chorus.voices.store.VoiceStore`
and a directory or an object store.

The store sees a flat namespace of small files (``<id>.json``, ``<id>.clip``,
``<id>.<family>.safetensors``: see :mod:`chorus.voices.layout`) through :class:`BlobStore`.
Two implementations:

* :class:`DirectoryBlobs`: a directory, possibly mounted by several machines. Writes go to a
  hidden temporary name in the same directory (``.NAME.tmp-PID-XXXX``), are fsynced, then
  renamed into place and the directory fsynced; :meth:`DirectoryBlobs.create` publishes with a
  hard link, which fails when the name exists, so concurrent writers agree on the first file.
  Every file is created with mode :data:`FILE_MODE` (0600: a voice can imitate a person, so
  only the server's user may read it), whatever the writer's library or umask would give.
* :class:`chorus.voices.objectstore.CachedObjectStore`: an object store (any fsspec URL) with a
  local directory caching the voice files that this process used.

Both also satisfy :class:`Blobs`, the part without local files, which is what an object store
offers; so a ``file://`` URL is served by a :class:`DirectoryBlobs` behind the cache.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable, Hashable, Protocol

from chorus.atomic import TEMP_MARK, hold_for_tests, temporary_sibling

logger = logging.getLogger(__name__)

STALE_TEMP_SECONDS = 3600.0  # temporaries older than this are left by interrupted writes
FILE_MODE = 0o600  # every voice file and record: owner read/write only

Stamp = Hashable
"""What a file looked like when listed: equal stamps mean unchanged content ((mtime_ns, size) in a
directory, (size, ETag or modification time) in an object store)."""


class Blobs(Protocol):
    """Named files in one flat namespace. Names are plain file names (no ``/``)."""

    location: str  # a directory or URL, for messages

    def listing(self) -> dict[str, Stamp]:
        """Every file's name and stamp, in one listing (temporaries of writes in progress left out)."""

    def stamp(self, name: str) -> Stamp | None:
        """The stamp of one file, None when it does not exist."""

    def read(self, name: str) -> bytes:
        """The file's bytes; FileNotFoundError when it does not exist."""

    def write(self, name: str, data: bytes) -> None:
        """Create or replace a file, atomically: a reader sees the old content or the new."""

    def create(self, name: str, data: bytes) -> bool:
        """Create a file unless one exists; False when it does (the first writer wins). Where the
        backend cannot tell, it writes and returns True."""

    def delete(self, *names: str) -> bool:
        """Remove files, in order; whether any of them existed."""


class BlobStore(Blobs, Protocol):
    """What a voice store needs: :class:`Blobs` plus local files to load voices from."""

    root: Path  # the local directory: the store itself, or its cache

    def exists(self, name: str) -> bool:
        """Whether the file exists; an object store may answer from what it saw in the last few
        seconds (its documented staleness bound)."""

    def local_file(self, name: str) -> Path:
        """A local copy of the file to read (fetched on a miss); it may not exist, and then
        reading it raises FileNotFoundError."""

    def write_file(self, name: str, fill: Callable[[Path], object]) -> None:
        """Like :meth:`write`, with the content written by ``fill(path)`` to a local path."""

    def uncache(self, *names: str) -> None:
        """Drop local copies kept as a cache (nothing to do where the local files are the store)."""

    def sweep(self) -> None:
        """Start-up housekeeping: warn about temporaries, remove those left long ago."""


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def _fsync_directory(path: Path) -> None:
    """Make renames in ``path`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and TEMP_MARK in name


class DirectoryBlobs:
    """Files in a directory (created if missing), safe to share between processes and machines:
    every write is atomic and durable (temporary, fsync, rename, fsync of the directory)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.location = str(self.root)

    def listing(self) -> dict[str, Stamp]:
        stamps = {}
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return {}
        for entry in entries:
            if _is_temporary(entry.name):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            stamps[entry.name] = (st.st_mtime_ns, st.st_size)
        return stamps

    def stamp(self, name: str) -> Stamp | None:
        try:
            st = (self.root / name).stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def local_file(self, name: str) -> Path:
        return self.root / name

    def write_file(self, name: str, fill: Callable[[Path], object]) -> None:
        path = self.root / name
        tmp = temporary_sibling(path)
        try:
            fill(tmp)
            os.chmod(tmp, FILE_MODE)
            _fsync_file(tmp)
            hold_for_tests("blob-write")
            os.replace(tmp, path)
            _fsync_directory(self.root)
        finally:
            _unlink(tmp)

    def write(self, name: str, data: bytes) -> None:
        self.write_file(name, lambda path: path.write_bytes(data))

    def create(self, name: str, data: bytes) -> bool:
        path = self.root / name
        tmp = temporary_sibling(path)
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, FILE_MODE)  # the umask may have taken bits away; never added
            hold_for_tests("blob-create")
            try:
                os.link(tmp, path)  # fails if the file exists: the first writer wins
            except FileExistsError:
                return False
            except OSError:  # a file system without hard links
                os.replace(tmp, path)
            _fsync_directory(self.root)
            return True
        finally:
            _unlink(tmp)

    def delete(self, *names: str) -> bool:
        removed = False
        for i, name in enumerate(names):
            if i:
                hold_for_tests("blob-delete")  # between two removals (tests only)
            removed = _unlink(self.root / name) or removed
        if removed:
            _fsync_directory(self.root)
        return removed

    def uncache(self, *names: str) -> None:
        pass

    def sweep(self) -> None:
        now = time.time()
        for entry in os.scandir(self.root):
            if not _is_temporary(entry.name):
                continue
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
                if age > STALE_TEMP_SECONDS:
                    _unlink(Path(entry.path))
                    logger.warning("voice store %s: removed %s, left by a write interrupted %.0f s ago",
                                   self.root, entry.name, age)
                else:
                    logger.warning("voice store %s: skipping %s (a write in progress, or interrupted)",
                                   self.root, entry.name)
            except OSError as exc:
                logger.warning("voice store %s: skipping %s: %s", self.root, entry.name, exc)

    def __repr__(self) -> str:
        return f"DirectoryBlobs({self.location!r})"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
