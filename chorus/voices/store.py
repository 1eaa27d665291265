"""A library of voices: uploaded reference clips turned into voices once, kept by id.

Layout of the store (flat, one pair of files per voice, in a directory or under an object-store
prefix; see :mod:`chorus.voices.blobs`)::

    <id>.safetensors   the voice (``Voice.save``: tensors and the variant it was built for)
    <id>.json          its metadata record (:mod:`chorus.voices.records`)

Ids are content addresses of the upload and the variant family. Hashing the upload rather than
the built voice finds a duplicate before the expensive build, and makes the id stable across
machines and replicas: the same clip uploaded twice, or to two replicas, is one voice with one
id. A duplicate upload returns the existing voice unchanged (its first name is kept).

The voice file is written first; the metadata record publishes it (a voice exists when its
record and its voice file do). The record is created only if absent (a hard link in a
directory, a conditional write in an object store), so concurrent uploads of the same clip
(threads, processes, replicas) agree on one record, the first; they wrote identical voice
files. A crash at any point leaves either a complete voice, or files that are ignored:
temporaries, or a voice file without a record (completed by uploading the clip again).

Reads go to the files whenever memory does not know the answer, so a store sees voices that
another process added: ``get`` keeps an LRU cache of loaded voices and checks on a hit that the
voice's record still exists (another process may have deleted it); ``list`` lists the files.
The id ``default`` is reserved for the checkpoint's built-in voice.
"""
from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from chorus.audio.errors import AudioError, AudioTooLongError, ReferenceAudioError
from chorus.voices.blobs import BlobStore, DirectoryBlobs, Stamp
from chorus.voices.records import (  # the store's public names, re-exported
    DEFAULT_VOICE_ID, ID_HEX_CHARS, ID_RE, MAX_ID_CHARS, MAX_NAME_CHARS, METADATA_FORMAT, InvalidVoiceIdError,
    ReservedVoiceError, UnknownVoiceError, VoiceInfo, VoiceRecord, VoiceStoreError, VoiceUploadError,
    check_name, check_voice_id, parse_record, record_info, upload_hash, variant_family,
)
from chorus.voices.voice import VOICE_FILE_SUFFIX, Voice, VoiceFormatError

if TYPE_CHECKING:
    from chorus.models.variants import Variant
    from chorus.voices.builder import VoiceFrontEnd

__all__ = ["VoiceStore", "VoiceInfo", "VoiceStoreError", "UnknownVoiceError", "InvalidVoiceIdError",
           "ReservedVoiceError", "VoiceUploadError", "DEFAULT_VOICE_ID", "ID_HEX_CHARS", "MAX_ID_CHARS",
           "MAX_NAME_CHARS", "METADATA_FORMAT", "METADATA_SUFFIX", "DEFAULT_MAX_UPLOAD_BYTES", "check_voice_id",
           "upload_hash", "variant_family"]

logger = logging.getLogger(__name__)

METADATA_SUFFIX = ".json"
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # a 60 s float32 stereo 48 kHz WAV is 23 MB
STORAGE_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # writes that fail for want of room


class VoiceStore:
    """Voices of one variant family in a directory or object store, plus the built-in voice as
    ``default``.

    Thread-safe: every method may be called from any thread. Builds run one at a time (they are
    the expensive part, and the front end's models are shared); reads never wait for a build.

    root: the directory (created if missing), which may be shared with other processes; or the
    :class:`~chorus.voices.blobs.BlobStore` to keep voices in (see
    :func:`chorus.voices.objectstore.open_blob_store` for an object store).
    front_end: builds voices from clips; None when the voice models are not loaded (then
    :meth:`add` raises and everything else works).
    variant: the variant this store serves; voices of other families in the same store are
    invisible to it.
    builtin: the checkpoint's built-in voice, served as ``default`` (None: there is none).
    cache_size: how many loaded voices stay in memory (least recently used go first; 0: none).
    max_upload_bytes: the largest upload :meth:`add` accepts.
    max_voices: the most voices :meth:`add` will hold (not counting ``default``); None: no limit.
    Replicas sharing the store check it each on their own, so together they may overshoot
    it by the number of concurrent uploads.
    """

    def __init__(self, root: "str | os.PathLike | BlobStore", front_end: "VoiceFrontEnd | None",
                 variant: "Variant", *, builtin: Voice | None, cache_size: int = 64,
                 max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, max_voices: int | None = None):
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        if max_upload_bytes <= 0:
            raise ValueError(f"max_upload_bytes must be positive, got {max_upload_bytes}")
        if max_voices is not None and max_voices < 0:
            raise ValueError(f"max_voices must be >= 0 or None, got {max_voices}")
        self.family = variant_family(variant)
        if front_end is not None and variant_family(front_end.variant) != self.family:
            raise ValueError(f"the voice front end builds {front_end.variant.name} voices, not {variant.name} ones")
        self.files: BlobStore = DirectoryBlobs(root) if isinstance(root, (str, os.PathLike)) else root
        self.root = self.files.root  # the local directory: the store, or its cache
        self.front_end = front_end
        self.variant = variant
        self.cache_size = cache_size
        self.max_upload_bytes = max_upload_bytes
        self.max_voices = max_voices
        self._builtin = builtin
        self._lock = threading.Lock()  # guards the three dicts below
        self._build_lock = threading.Lock()  # one build (and publication) at a time
        self._cache: OrderedDict[str, Voice] = OrderedDict()
        self._records: dict[str, VoiceRecord] = {}
        self._warned: set[tuple[str, Any]] = set()
        self._scan()

    # ------------------------------------------------------------------------------- public

    def add(self, data: bytes, *, name: str | None = None) -> VoiceInfo:
        """Build a voice from an uploaded clip, store it and return its info.

        The size is checked before anything else, and a duplicate (the same bytes uploaded
        before for this variant family) is answered from the store without building: its info
        is returned unchanged, first name kept. Raises :class:`VoiceUploadError` (nothing
        written) for unusable uploads, :class:`VoiceStoreError` (code
        ``voice_models_not_loaded``) when there is no front end, or (code
        ``insufficient_storage``, nothing left behind) when the store has no room.
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
        name = check_name(name)
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
            except AudioTooLongError as exc:
                raise VoiceUploadError(str(exc), code="too_long") from exc
            except AudioError as exc:  # AudioDecodeError and any other unusable audio
                raise VoiceUploadError(str(exc), code="invalid_audio") from exc
            record = {
                "format": METADATA_FORMAT, "id": voice_id, "name": name, "created_at": time.time(),
                "duration_s": round(reference.duration, 3), "variant": self.variant.name, "family": self.family,
                "content_hash": digest, "voice_hash": voice.content_hash, "bytes": size,
            }
            try:
                # a leftover voice file of the same clip is overwritten with the same content
                self.files.write_file(_voice_name(voice_id), voice.save)
                info = self._publish(voice_id, record)
            except OSError as exc:
                if exc.errno not in STORAGE_FULL:
                    raise
                if self._record(voice_id, warn=False) is None:
                    self.files.delete(_voice_name(voice_id))  # unpublished: leave nothing behind
                raise VoiceStoreError(f"the voice store at {self.files.location} is out of space "
                                      f"({os.strerror(exc.errno)}); nothing was stored: free space or raise the "
                                      "quota, then upload again", code="insufficient_storage") from exc
        with self._lock:
            self._remember(voice_id, voice)
        logger.info("voice %s added (%s, %.1f s, %d bytes)", voice_id, name or "unnamed", reference.duration, size)
        return info

    def get(self, voice_id: str) -> Voice:
        """The voice with this id: ``default`` is the built-in voice; others come from the cache
        or, on a miss, from the store. Raises :class:`UnknownVoiceError`
        (:class:`InvalidVoiceIdError` for malformed ids)."""
        if voice_id == DEFAULT_VOICE_ID:
            return self._require_builtin()
        check_voice_id(voice_id)
        with self._lock:
            voice = self._cache.get(voice_id)
        if voice is not None:
            if self.files.exists(_meta_name(voice_id)):
                with self._lock:
                    if voice_id in self._cache:
                        self._cache.move_to_end(voice_id)
                return voice
            self._forget(voice_id)  # deleted by another process
        self._require_record(voice_id)
        try:
            voice = Voice.load(self.files.local_file(_voice_name(voice_id)))
        except FileNotFoundError:
            self._forget(voice_id)
            raise UnknownVoiceError(f"voice {voice_id!r} was deleted") from None
        except VoiceFormatError as exc:
            logger.error("voice %s: %s", voice_id, exc)
            self.files.uncache(_voice_name(voice_id))
            raise VoiceStoreError(f"voice {voice_id!r} is damaged in {self.files.location}; delete it and upload "
                                  "its clip again", code="damaged_voice") from exc
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
        built-in voice. Read from the store, so voices added elsewhere appear."""
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
        # unpublish first: a crash in between leaves an ignored voice file
        removed = self.files.delete(_meta_name(voice_id), _voice_name(voice_id))
        self._forget(voice_id)
        if removed:
            logger.info("voice %s deleted", voice_id)
        return removed

    def cached_ids(self) -> builtins.list[str]:
        """Ids of the voices held in memory, least recently used first."""
        with self._lock:
            return builtins.list(self._cache)

    def __repr__(self) -> str:
        return f"VoiceStore({self.files.location!r}, variant={self.variant.name!r})"

    # ------------------------------------------------------------------------------ helpers

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
        self.files.uncache(_voice_name(voice_id))

    def _warn_once(self, key: tuple[str, Any], message: str, *args: Any) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        logger.warning(message, *args)

    def _record(self, voice_id: str, *, warn: bool = True, listing: dict[str, Stamp] | None = None
                ) -> VoiceRecord | None:
        """The published record of ``voice_id`` whose voice file exists, else None. ``listing``:
        stamps from a listing of the store, instead of asking for them one by one."""
        meta, voice_file = _meta_name(voice_id), _voice_name(voice_id)
        stamp = self.files.stamp(meta) if listing is None else listing.get(meta)
        if stamp is None:
            self._forget(voice_id)
            return None
        with self._lock:
            record = self._records.get(voice_id)
        if record is None or record.stamp != stamp:
            record = self._parse(voice_id, stamp, warn)
            if record is None:
                return None
            with self._lock:
                self._records[voice_id] = record
        has_voice = self.files.stamp(voice_file) is not None if listing is None else voice_file in listing
        if not has_voice:
            if warn:
                self._warn_once((voice_id, "orphan-record", stamp), "voice store %s: %s has no voice file %s; "
                                "skipped", self.files.location, meta, voice_file)
            return None
        return record

    def _parse(self, voice_id: str, stamp: Stamp, warn: bool) -> VoiceRecord | None:
        meta = _meta_name(voice_id)
        try:
            return parse_record(self.files.read(meta), voice_id, stamp)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if warn:
                self._warn_once((voice_id, "bad-record", stamp), "voice store %s: %s is unreadable (%s); skipped",
                                self.files.location, meta, exc)
            return None

    def _require_record(self, voice_id: str) -> VoiceRecord:
        record = self._record(voice_id)
        if record is None:
            raise UnknownVoiceError(f"there is no voice {voice_id!r}")
        if record.family != self.family:
            raise UnknownVoiceError(f"voice {voice_id!r} was built for the {record.info.variant} variant; "
                                    f"this server runs {self.variant.name}: upload the clip again here")
        return record

    def _voice_records(self) -> builtins.list[VoiceRecord]:
        """Records of this family's voices, from one listing of the store."""
        listing = self.files.listing()
        records = []
        for voice_id in _record_ids(listing):
            record = self._record(voice_id, listing=listing)
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

    def _publish(self, voice_id: str, record: dict[str, Any]) -> VoiceInfo:
        """Create the metadata record unless another writer already did; returns the info of the
        record that won."""
        meta = _meta_name(voice_id)
        data = json.dumps(record, indent=1).encode("utf-8")
        if not self.files.create(meta, data):  # the first writer wins
            existing = self._record(voice_id, warn=False)
            if existing is not None:
                if existing.content_hash != record["content_hash"]:
                    raise VoiceStoreError(f"voice id {voice_id} is taken by a different clip", code="id_collision")
                return existing.info
            self.files.write(meta, data)  # a damaged record: ours replaces it
        published = self._record(voice_id, warn=False)
        return record_info(record) if published is None else published.info  # None: deleted again already

    def _scan(self) -> None:
        """Look at every file once at startup: warn about (and skip) what is not a complete voice,
        remove temporaries left by interrupted writes long ago. Never fails on one bad file."""
        self.files.sweep()
        listing = self.files.listing()
        where = self.files.location
        count = 0
        for name in sorted(listing):
            try:
                if name.endswith(METADATA_SUFFIX):
                    stem = name[: -len(METADATA_SUFFIX)]
                    if not ID_RE.fullmatch(stem) or stem == DEFAULT_VOICE_ID:
                        logger.warning("voice store %s: %s is not named after a voice id; skipped", where, name)
                    elif self._record(stem, listing=listing) is not None:
                        count += 1
                elif name.endswith(VOICE_FILE_SUFFIX):
                    if _meta_name(name[: -len(VOICE_FILE_SUFFIX)]) not in listing:
                        logger.warning("voice store %s: %s has no metadata record (an interrupted upload); "
                                       "skipped", where, name)
                else:
                    logger.warning("voice store %s: ignoring %s, which is not part of a voice", where, name)
            except Exception as exc:  # one bad file never stops the store
                logger.warning("voice store %s: skipping %s: %s", where, name, exc)
        logger.info("voice store %s: %d voices", where, count)


def _voice_name(voice_id: str) -> str:
    return f"{voice_id}{VOICE_FILE_SUFFIX}"


def _meta_name(voice_id: str) -> str:
    return f"{voice_id}{METADATA_SUFFIX}"


def _record_ids(listing: dict[str, Stamp]) -> builtins.list[str]:
    stems = (name[: -len(METADATA_SUFFIX)] for name in listing if name.endswith(METADATA_SUFFIX))
    return [stem for stem in stems if ID_RE.fullmatch(stem) and stem != DEFAULT_VOICE_ID]
