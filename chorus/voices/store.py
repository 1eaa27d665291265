"""A library of voices kept on disk: uploaded reference clips turned into voices once, by id.

Layout of the store's directory (flat, one pair of files per voice)::

    <id>.safetensors   the voice (``Voice.save``: tensors and the variant it was built for)
    <id>.json          its metadata record: id, name, created_at, duration_s, variant, family,
                       content_hash, voice_hash, bytes

Ids are content addresses: the first :data:`ID_HEX_CHARS` hex digits of the SHA-256 of the
uploaded bytes together with the variant *family* (variants whose voices are interchangeable,
see :func:`variant_family`). Hashing the upload rather than the built voice finds a duplicate
before the expensive build, and makes the id stable across machines and replicas: the same clip
uploaded twice, or to two replicas, is one voice with one id. A duplicate upload returns the
existing voice unchanged (its first name is kept).

Writes are atomic and durable: each file is written under a hidden temporary name in the same
directory (``.NAME.tmp-PID-XXXX``), flushed to disk, then renamed into place. The voice file
goes first; the metadata record publishes it (a voice exists when its record and its voice file
do). The record is published with a hard link, which fails when another writer got there first,
so concurrent uploads of the same clip (threads, processes, replicas sharing the directory)
agree on one record, the first; both wrote identical voice files. A crash at any point leaves
either a complete voice, or files that are ignored: temporaries, or a voice file without a
record (completed by uploading the clip again).

Reads go to disk whenever memory does not know the answer, so a store sees voices that another
process added to the same directory: ``get`` keeps an LRU cache of loaded voices and checks on a
hit that the voice's record still exists (another process may have deleted it); ``list`` scans
the directory. The id ``default`` is reserved for the checkpoint's built-in voice.
"""
from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import re
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chorus.atomic import TEMP_MARK, temporary_sibling
from chorus.audio.errors import AudioError, ReferenceAudioError
from chorus.voices.voice import VOICE_FILE_SUFFIX, Voice, VoiceFormatError, voices_interchangeable

if TYPE_CHECKING:
    from chorus.models.variants import Variant
    from chorus.voices.builder import VoiceFrontEnd

logger = logging.getLogger(__name__)

DEFAULT_VOICE_ID = "default"
METADATA_SUFFIX = ".json"
METADATA_FORMAT = "chorus-voice-record/1"
ID_HEX_CHARS = 16  # 64 bits of SHA-256: collisions are out of reach for any voice library
MAX_ID_CHARS = 64
MAX_NAME_CHARS = 128
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # a 60 s float32 stereo 48 kHz WAV is 23 MB
STALE_TEMP_SECONDS = 3600.0  # temporaries older than this are left by interrupted writes
_ID_RE = re.compile(rf"[a-z0-9_-]{{1,{MAX_ID_CHARS}}}")
_HASH_DOMAIN = b"chorus-voice-upload/1\0"


# ------------------------------------------------------------------------------------- errors

class VoiceStoreError(Exception):
    """Base class of the store's errors. ``code`` is a stable machine-readable name."""

    code = "voice_store_error"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:  # KeyError would show the message quoted
        return self.message


class UnknownVoiceError(VoiceStoreError, KeyError):
    """No voice has this id (for this variant). Code ``unknown_voice``."""

    code = "unknown_voice"


class InvalidVoiceIdError(UnknownVoiceError):
    """The id is not of the form ids take (``[a-z0-9_-]``, at most 64 characters), so no voice
    can have it; such an id never reaches the file system. Code ``invalid_voice_id``."""

    code = "invalid_voice_id"


class ReservedVoiceError(VoiceStoreError, ValueError):
    """The built-in voice ``default`` cannot be deleted. Code ``reserved_voice``."""

    code = "reserved_voice"


class VoiceUploadError(VoiceStoreError, ValueError):
    """An upload that cannot become a voice; nothing was written. ``code`` is one of:

    ``too_large`` (more than ``max_upload_bytes``), ``empty`` (no bytes, or audio without
    samples), ``invalid_audio`` (not decodable: not audio, corrupt, truncated), ``too_short``
    (under 0.5 s, or the variant's own minimum), ``silent``, ``invalid_name``,
    ``too_many_voices`` (the store holds ``max_voices`` voices).
    """

    code = "invalid_audio"


# ------------------------------------------------------------------------------------ records

@dataclass(frozen=True)
class VoiceInfo:
    """What the store tells about a voice.

    created_at: seconds since the epoch (0.0 for the built-in voice). duration_s: length of the
    clip the voice was built from, after the 60 s cut (None for the built-in voice). variant:
    the variant the voice was built for.
    """

    id: str
    name: str | None
    created_at: float
    duration_s: float | None
    variant: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Record:
    info: VoiceInfo
    family: str
    content_hash: str
    stamp: tuple[int, int]  # (mtime_ns, size) of the record file it was read from


def variant_family(variant: "Variant | str") -> str:
    """The name that all variants sharing voices with ``variant`` agree on (the first of them in
    the variant table): ``multilingual`` for multilingual v2 and v3, else the variant's own name."""
    from chorus.models.variants import VARIANTS

    name = variant if isinstance(variant, str) else variant.name
    if name not in VARIANTS:
        return name
    return next(candidate for candidate in VARIANTS if voices_interchangeable(candidate, name))


def upload_hash(data: bytes, family: str) -> str:
    """SHA-256 (hex) of an upload for a variant family; a voice's id is its first characters."""
    h = hashlib.sha256(_HASH_DOMAIN)
    h.update(family.encode("utf-8") + b"\0")
    h.update(data)
    return h.hexdigest()


def check_voice_id(voice_id: Any) -> str:
    """Return ``voice_id`` if it has the form of an id, else raise :class:`InvalidVoiceIdError`."""
    if not isinstance(voice_id, str) or not _ID_RE.fullmatch(voice_id):
        shown = repr(voice_id) if len(repr(voice_id)) <= 80 else repr(voice_id)[:77] + "..."
        raise InvalidVoiceIdError(f"{shown} is not a voice id: ids are 1-{MAX_ID_CHARS} characters of "
                                  "a-z, 0-9, '_' and '-'")
    return voice_id


def _check_name(name: Any) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str):
        raise VoiceUploadError(f"a voice name must be text, got {type(name).__name__}", code="invalid_name")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        raise VoiceUploadError(f"a voice name has at most {MAX_NAME_CHARS} characters, got {len(name)}",
                               code="invalid_name")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise VoiceUploadError("a voice name cannot contain control characters", code="invalid_name")
    return name or None


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


# -------------------------------------------------------------------------------------- store

class VoiceStore:
    """Voices of one variant family in a directory, plus the built-in voice as ``default``.

    Thread-safe: every method may be called from any thread. Builds run one at a time (they are
    the expensive part, and the front end's models are shared); reads never wait for a build.

    root: the directory (created if missing); it may be shared with other processes.
    front_end: builds voices from clips; None when the voice models are not loaded (then
    :meth:`add` raises and everything else works).
    variant: the variant this store serves; voices of other families in the same directory are
    invisible to it.
    builtin: the checkpoint's built-in voice, served as ``default`` (None: there is none).
    cache_size: how many loaded voices stay in memory (least recently used go first; 0: none).
    max_upload_bytes: the largest upload :meth:`add` accepts.
    max_voices: the most voices :meth:`add` will hold (not counting ``default``); None: no limit.
    Replicas sharing the directory check it each on their own, so together they may overshoot
    it by the number of concurrent uploads.
    """

    def __init__(self, root: str | os.PathLike, front_end: "VoiceFrontEnd | None", variant: "Variant", *,
                 builtin: Voice | None, cache_size: int = 64, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
                 max_voices: int | None = None):
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        if max_upload_bytes <= 0:
            raise ValueError(f"max_upload_bytes must be positive, got {max_upload_bytes}")
        if max_voices is not None and max_voices < 0:
            raise ValueError(f"max_voices must be >= 0 or None, got {max_voices}")
        self.family = variant_family(variant)
        if front_end is not None and variant_family(front_end.variant) != self.family:
            raise ValueError(f"the voice front end builds {front_end.variant.name} voices, not {variant.name} ones")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.front_end = front_end
        self.variant = variant
        self.cache_size = cache_size
        self.max_upload_bytes = max_upload_bytes
        self.max_voices = max_voices
        self._builtin = builtin
        self._lock = threading.Lock()  # guards the three dicts below
        self._build_lock = threading.Lock()  # one build (and publication) at a time
        self._cache: OrderedDict[str, Voice] = OrderedDict()
        self._records: dict[str, _Record] = {}
        self._warned: set[tuple[str, Any]] = set()
        self._scan()

    # ------------------------------------------------------------------------------- public

    def add(self, data: bytes, *, name: str | None = None) -> VoiceInfo:
        """Build a voice from an uploaded clip, store it and return its info.

        The size is checked before anything else, and a duplicate (the same bytes uploaded
        before for this variant family) is answered from disk without building: its info is
        returned unchanged, first name kept. Raises :class:`VoiceUploadError` (nothing written)
        for unusable uploads, :class:`VoiceStoreError` (code ``voice_models_not_loaded``) when
        there is no front end.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"an upload is bytes, got {type(data).__name__}")
        data = bytes(data)
        size = len(data)
        if size > self.max_upload_bytes:
            raise VoiceUploadError(f"the upload is {size} bytes; the limit is {self.max_upload_bytes} bytes",
                                   code="too_large")
        if size == 0:
            raise VoiceUploadError("the upload is empty (0 bytes); send an audio file", code="empty")
        name = _check_name(name)
        front_end = self.front_end
        if front_end is None:
            raise VoiceStoreError("the voice models are not loaded, so voices cannot be added here",
                                  code="voice_models_not_loaded")
        digest = upload_hash(data, self.family)
        voice_id = digest[:ID_HEX_CHARS]
        existing = self._existing(voice_id, digest)
        if existing is not None:
            return existing
        with self._build_lock:
            existing = self._existing(voice_id, digest)  # the same clip may have been added meanwhile
            if existing is not None:
                return existing
            if self.max_voices is not None and len(self._voice_records()) >= self.max_voices:
                raise VoiceUploadError(f"the voice library is full ({self.max_voices} voices); delete one first",
                                       code="too_many_voices")
            try:
                reference = front_end.prepare(data)
                voice = front_end.build(reference, name=name or voice_id)
            except ReferenceAudioError as exc:
                code = exc.reason if exc.reason in ("empty", "too_short", "silent") else "invalid_audio"
                raise VoiceUploadError(str(exc), code=code) from exc
            except AudioError as exc:  # AudioDecodeError and any other unusable audio
                raise VoiceUploadError(str(exc), code="invalid_audio") from exc
            record = {
                "format": METADATA_FORMAT, "id": voice_id, "name": name, "created_at": time.time(),
                "duration_s": round(reference.duration, 3), "variant": self.variant.name, "family": self.family,
                "content_hash": digest, "voice_hash": voice.content_hash, "bytes": size,
            }
            self._write_voice(voice_id, voice)
            info = self._publish(voice_id, record)
        with self._lock:
            self._remember(voice_id, voice)
        logger.info("voice %s added (%s, %.1f s, %d bytes)", voice_id, name or "unnamed", reference.duration, size)
        return info

    def get(self, voice_id: str) -> Voice:
        """The voice with this id: ``default`` is the built-in voice; others come from the cache
        or, on a miss, from disk. Raises :class:`UnknownVoiceError` (:class:`InvalidVoiceIdError`
        for malformed ids)."""
        if voice_id == DEFAULT_VOICE_ID:
            return self._require_builtin()
        check_voice_id(voice_id)
        with self._lock:
            voice = self._cache.get(voice_id)
        if voice is not None:
            if self._meta_path(voice_id).is_file():
                with self._lock:
                    if voice_id in self._cache:
                        self._cache.move_to_end(voice_id)
                return voice
            self._forget(voice_id)  # deleted by another process
        self._require_record(voice_id)
        try:
            voice = Voice.load(self._voice_path(voice_id))
        except FileNotFoundError:
            self._forget(voice_id)
            raise UnknownVoiceError(f"voice {voice_id!r} was deleted") from None
        except VoiceFormatError as exc:
            logger.error("voice %s: %s", voice_id, exc)
            raise VoiceStoreError(f"voice {voice_id!r} is damaged on disk; delete it and upload its clip again",
                                  code="damaged_voice") from exc
        with self._lock:
            voice = self._cache.get(voice_id, voice)  # another thread may have loaded it meanwhile
            self._remember(voice_id, voice)
        return voice

    def info(self, voice_id: str) -> VoiceInfo:
        """Info of one voice (see :meth:`get` for the errors)."""
        if voice_id == DEFAULT_VOICE_ID:
            return self._builtin_info(self._require_builtin())
        check_voice_id(voice_id)
        return self._require_record(voice_id).info

    def list(self) -> builtins.list[VoiceInfo]:
        """Every voice of this variant family, oldest first; ``default`` first when there is a
        built-in voice. Read from the directory, so voices added elsewhere appear."""
        infos = [] if self._builtin is None else [self._builtin_info(self._builtin)]
        infos += sorted((r.info for r in self._voice_records()), key=lambda i: (i.created_at, i.id))
        return infos

    def delete(self, voice_id: str) -> bool:
        """Remove a voice (record, voice file and cache entry). Returns whether it existed.
        ``default`` raises :class:`ReservedVoiceError`; malformed ids :class:`InvalidVoiceIdError`."""
        if voice_id == DEFAULT_VOICE_ID:
            raise ReservedVoiceError("the built-in voice 'default' cannot be deleted")
        check_voice_id(voice_id)
        record = self._record(voice_id, warn=False)
        if record is not None and record.family != self.family:
            return False  # another variant's voice: not ours to see or delete
        removed = _unlink(self._meta_path(voice_id))  # unpublish first: a crash here leaves an ignored file
        removed = _unlink(self._voice_path(voice_id)) or removed
        self._forget(voice_id)
        if removed:
            _fsync_directory(self.root)
            logger.info("voice %s deleted", voice_id)
        return removed

    def cached_ids(self) -> builtins.list[str]:
        """Ids of the voices held in memory, least recently used first."""
        with self._lock:
            return builtins.list(self._cache)

    def __repr__(self) -> str:
        return f"VoiceStore({str(self.root)!r}, variant={self.variant.name!r})"

    # ------------------------------------------------------------------------------ helpers

    def _voice_path(self, voice_id: str) -> Path:
        return self.root / f"{voice_id}{VOICE_FILE_SUFFIX}"

    def _meta_path(self, voice_id: str) -> Path:
        return self.root / f"{voice_id}{METADATA_SUFFIX}"

    def _require_builtin(self) -> Voice:
        if self._builtin is None:
            raise UnknownVoiceError("this model has no built-in voice; use an uploaded voice's id")
        return self._builtin

    def _builtin_info(self, voice: Voice) -> VoiceInfo:
        return VoiceInfo(id=DEFAULT_VOICE_ID, name=voice.name or DEFAULT_VOICE_ID, created_at=0.0,
                         duration_s=None, variant=voice.variant or self.variant.name)

    def _remember(self, voice_id: str, voice: Voice) -> None:
        """Put a voice in the LRU cache (the caller holds the lock)."""
        if self.cache_size == 0:
            return
        self._cache[voice_id] = voice
        self._cache.move_to_end(voice_id)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _forget(self, voice_id: str) -> None:
        with self._lock:
            self._cache.pop(voice_id, None)
            self._records.pop(voice_id, None)

    def _warn_once(self, key: tuple[str, Any], message: str, *args: Any) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        logger.warning(message, *args)

    def _record(self, voice_id: str, *, warn: bool = True) -> _Record | None:
        """The published record of ``voice_id`` whose voice file exists, else None."""
        meta = self._meta_path(voice_id)
        try:
            st = meta.stat()
        except FileNotFoundError:
            self._forget(voice_id)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            record = self._records.get(voice_id)
        if record is None or record.stamp != stamp:
            record = self._parse(voice_id, meta, stamp, warn)
            if record is None:
                return None
            with self._lock:
                self._records[voice_id] = record
        if not self._voice_path(voice_id).is_file():
            if warn:
                self._warn_once((voice_id, "orphan-record", stamp),
                                "voice store %s: %s has no voice file %s; skipped", self.root, meta.name,
                                self._voice_path(voice_id).name)
            return None
        return record

    def _parse(self, voice_id: str, meta: Path, stamp: tuple[int, int], warn: bool) -> _Record | None:
        try:
            raw = json.loads(meta.read_text("utf-8"))
            if not isinstance(raw, dict) or raw.get("format") != METADATA_FORMAT or raw.get("id") != voice_id:
                raise ValueError(f"not a {METADATA_FORMAT} record of {voice_id}")
            name, duration = raw.get("name"), raw.get("duration_s")
            info = VoiceInfo(
                id=voice_id, name=None if name is None else str(name), created_at=float(raw["created_at"]),
                duration_s=None if duration is None else float(duration), variant=str(raw["variant"]))
            family = str(raw.get("family") or variant_family(info.variant))
            return _Record(info=info, family=family, content_hash=str(raw["content_hash"]), stamp=stamp)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if warn:
                self._warn_once((voice_id, "bad-record", stamp), "voice store %s: %s is unreadable (%s); skipped",
                                self.root, meta.name, exc)
            return None

    def _require_record(self, voice_id: str) -> _Record:
        record = self._record(voice_id)
        if record is None:
            raise UnknownVoiceError(f"there is no voice {voice_id!r}")
        if record.family != self.family:
            raise UnknownVoiceError(f"voice {voice_id!r} was built for the {record.info.variant} variant; "
                                    f"this server runs {self.variant.name}: upload the clip again here")
        return record

    def _voice_records(self) -> builtins.list[_Record]:
        """Records of this family's voices, from a scan of the directory."""
        records = []
        try:
            entries = builtins.list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            stem = entry.name[: -len(METADATA_SUFFIX)]
            if not entry.name.endswith(METADATA_SUFFIX) or not _ID_RE.fullmatch(stem) or stem == DEFAULT_VOICE_ID:
                continue
            record = self._record(stem)
            if record is not None and record.family == self.family:
                records.append(record)
        return records

    def _existing(self, voice_id: str, digest: str) -> VoiceInfo | None:
        record = self._record(voice_id, warn=False)
        if record is None:
            return None
        if record.content_hash != digest:
            raise VoiceStoreError(f"voice id {voice_id} is taken by a different clip (a hash prefix collision)",
                                  code="id_collision")
        return record.info

    def _write_voice(self, voice_id: str, voice: Voice) -> None:
        path = self._voice_path(voice_id)
        tmp = temporary_sibling(path)
        try:
            voice.save(tmp)
            _fsync_file(tmp)
            os.replace(tmp, path)  # a leftover of the same clip is overwritten with the same content
        finally:
            _unlink(tmp)

    def _publish(self, voice_id: str, record: dict[str, Any]) -> VoiceInfo:
        """Write the metadata record under its final name unless another writer already did;
        returns the info of the record that won."""
        path = self._meta_path(voice_id)
        tmp = temporary_sibling(path)
        try:
            with open(tmp, "wb") as f:
                f.write(json.dumps(record, indent=1).encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # fails if the record exists: the first writer wins
            except FileExistsError:
                existing = self._record(voice_id, warn=False)
                if existing is not None:
                    if existing.content_hash != record["content_hash"]:
                        raise VoiceStoreError(f"voice id {voice_id} is taken by a different clip",
                                              code="id_collision") from None
                    return existing.info
                os.replace(tmp, path)  # a damaged record: ours replaces it
            except OSError:  # a file system without hard links
                os.replace(tmp, path)
            _fsync_directory(self.root)
        finally:
            _unlink(tmp)
        published = self._record(voice_id, warn=False)
        if published is None:  # deleted again already; report what was written
            return VoiceInfo(id=voice_id, name=record["name"], created_at=record["created_at"],
                             duration_s=record["duration_s"], variant=record["variant"])
        return published.info

    def _scan(self) -> None:
        """Look at every file once at startup: warn about (and skip) what is not a complete voice,
        remove temporaries left by interrupted writes long ago. Never fails on one bad file."""
        now = time.time()
        count = 0
        for entry in os.scandir(self.root):
            name = entry.name
            try:
                if name.startswith(".") and TEMP_MARK in name:
                    age = now - entry.stat(follow_symlinks=False).st_mtime
                    if age > STALE_TEMP_SECONDS:
                        _unlink(Path(entry.path))
                        logger.warning("voice store %s: removed %s, left by a write interrupted %.0f s ago",
                                       self.root, name, age)
                    else:
                        logger.warning("voice store %s: skipping %s (a write in progress, or interrupted)",
                                       self.root, name)
                elif name.endswith(METADATA_SUFFIX):
                    stem = name[: -len(METADATA_SUFFIX)]
                    if not _ID_RE.fullmatch(stem) or stem == DEFAULT_VOICE_ID:
                        logger.warning("voice store %s: %s is not named after a voice id; skipped", self.root, name)
                    elif self._record(stem) is not None:
                        count += 1
                elif name.endswith(VOICE_FILE_SUFFIX):
                    if not self._meta_path(name[: -len(VOICE_FILE_SUFFIX)]).exists():
                        logger.warning("voice store %s: %s has no metadata record (an interrupted upload); skipped",
                                       self.root, name)
                else:
                    logger.warning("voice store %s: ignoring %s, which is not part of a voice", self.root, name)
            except Exception as exc:  # one bad file never stops the store
                logger.warning("voice store %s: skipping %s: %s", self.root, name, exc)
        logger.info("voice store %s: %d voices", self.root, count)
