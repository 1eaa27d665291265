"""A library of voices: an uploaded reference clip kept once, built per variant family on use.

Layout of the store (flat, in a directory or under an object-store prefix; names in
:mod:`chorus.voices.layout`, files through :mod:`chorus.voices.blobs`)::

    <id>.json                    its metadata record (:mod:`chorus.voices.records`, format 2)
    <id>.clip                    the uploaded clip, byte for byte
    <id>.<family>.safetensors    the voice built for one variant family (``Voice.save``; one per
                                 family that used it: ``turbo``, ``original``, ``multilingual``...)

Ids are content addresses of the upload alone, so one upload is one voice for every model: the
same clip uploaded twice, to two replicas or through stores of two families, gets one id.
Hashing the upload rather than a built voice finds a duplicate before the expensive build. A
duplicate upload returns the existing voice unchanged (its first name is kept) and builds
nothing. ``add`` builds the voice for the store's own family (which validates the upload);
``get`` through a store of another family builds that family's voice from the kept clip on
first use and keeps it as another file. A clip that this family's clip rules refuse (Turbo
needs more than 5 s) is a :class:`VoiceStoreError` with code ``unusable_clip``.

Publication: the family's voice file and the clip are written first; the metadata record
publishes them (a voice exists when its record does). The record is created only if absent (a
hard link in a directory, a conditional write in an object store), so concurrent uploads of the
same clip (threads, processes, replicas, stores of different families) agree on one record, the
first; the clips they wrote are identical, and so are two builds of one family's file, which may
race (the last write wins). A crash at any point leaves either a complete voice, or files that
are ignored: temporaries, or a clip and voice files without a record (uploading the clip again
completes it). ``delete`` removes the record first, then the clip and every family's file.

The old layout (format-1 records, before one voice served every family): ``<id>.json`` and
``<id>.safetensors`` of one family, whose id also hashed the family. Such voices stay readable
by stores of their family (a voice exists when its record and voice file do) and invisible to
the others; uploading their clip again makes a new voice of the new layout, with a new id.

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
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chorus.audio.errors import AudioError, AudioTooLongError, ReferenceAudioError
from chorus.voices.blobs import BlobStore, DirectoryBlobs, Stamp
from chorus.voices.layout import RECORD_SUFFIX, clip_name, files_of, parse_name, record_name, voice_name
from chorus.voices.records import (  # the store's public names, re-exported
    DEFAULT_VOICE_ID, ID_HEX_CHARS, LEGACY_METADATA_FORMAT, MAX_ID_CHARS, MAX_NAME_CHARS, METADATA_FORMAT,
    InvalidVoiceIdError, ReservedVoiceError, UnknownVoiceError, VoiceInfo, VoiceRecord, VoiceStoreError,
    VoiceUploadError, check_name, check_voice_id, new_record, parse_record, record_info, upload_hash,
    variant_family,
)
from chorus.voices.voice import Voice, VoiceFormatError

if TYPE_CHECKING:
    from chorus.audio import ReferenceAudio
    from chorus.models.variants import Variant
    from chorus.voices.builder import VoiceFrontEnd

__all__ = ["VoiceStore", "VoiceInfo", "VoiceStoreError", "UnknownVoiceError", "InvalidVoiceIdError",
           "ReservedVoiceError", "VoiceUploadError", "DEFAULT_VOICE_ID", "ID_HEX_CHARS", "MAX_ID_CHARS",
           "MAX_NAME_CHARS", "METADATA_FORMAT", "LEGACY_METADATA_FORMAT", "METADATA_SUFFIX",
           "DEFAULT_MAX_UPLOAD_BYTES", "check_voice_id", "upload_hash", "variant_family"]

logger = logging.getLogger(__name__)

METADATA_SUFFIX = RECORD_SUFFIX
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # a 60 s float32 stereo 48 kHz WAV is 23 MB
STORAGE_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # writes that fail for want of room


class VoiceStore:
    """The voices of a store as one variant family sees them, plus the built-in voice as
    ``default``: every voice kept as its clip, and the old layout's voices of this family.

    Thread-safe: every method may be called from any thread. Builds run one at a time (they are
    the expensive part, and the front end's models are shared); reads of voices already built
    for this family never wait for a build.

    root: the directory (created if missing), which may be shared with other processes and with
    stores of other families; or the :class:`~chorus.voices.blobs.BlobStore` to keep voices in
    (see :func:`chorus.voices.objectstore.open_blob_store` for an object store).
    front_end: builds voices from clips; None when the voice models are not loaded (then
    :meth:`add` raises, and so does :meth:`get` of a voice not yet built for this family).
    variant: the variant this store serves; it builds voices for the variant's family.
    builtin: the checkpoint's built-in voice, served as ``default`` (None: there is none).
    cache_size: how many loaded voices stay in memory (least recently used go first; 0: none).
    max_upload_bytes: the largest upload :meth:`add` accepts.
    max_voices: the most voices :meth:`add` will hold (those this store lists, not counting
    ``default``); None: no limit. Replicas sharing the store check it each on their own, so
    together they may overshoot it by the number of concurrent uploads.
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
        self._lock = threading.Lock()  # guards the four dicts below
        self._build_lock = threading.Lock()  # one build (and publication) at a time
        self._cache: OrderedDict[str, Voice] = OrderedDict()
        self._records: dict[str, VoiceRecord] = {}
        self._unusable: dict[str, tuple[str, str]] = {}  # id -> (content hash, why this family cannot build it)
        self._warned: set[tuple[str, Any]] = set()
        self._scan()

    # ------------------------------------------------------------------------------- public

    def add(self, data: bytes, *, name: str | None = None) -> VoiceInfo:
        """Keep an uploaded clip as a voice, build it for this family, and return its info.

        The size is checked before anything else, and a duplicate (the same bytes uploaded
        before, through any store) is answered from the store without building: its info is
        returned unchanged, first name kept. Raises :class:`VoiceUploadError` (nothing written)
        for uploads this family cannot build, :class:`VoiceStoreError` (code
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
        digest = upload_hash(data)
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
            reference, voice = _build_upload(front_end, data, name=name or voice_id)
            record = new_record(voice_id, name=name, duration_s=reference.duration, content_hash=digest, size=size,
                                variant=self.variant.name, voice_hash=voice.content_hash)
            written = (voice_name(voice_id, self.family), clip_name(voice_id))
            try:
                # leftovers of the same clip (an interrupted upload or delete) are overwritten
                # with the same content
                self.files.write_file(written[0], voice.save)
                self.files.write(written[1], data)
                info = self._publish(voice_id, record)
            except OSError as exc:
                if exc.errno not in STORAGE_FULL:
                    raise
                if self._record(voice_id, warn=False) is None:
                    self.files.delete(*written)  # unpublished: leave nothing behind
                raise VoiceStoreError(f"the voice store at {self.files.location} is out of space "
                                      f"({os.strerror(exc.errno)}); nothing was stored: free space or raise the "
                                      "quota, then upload again", code="insufficient_storage") from exc
        with self._lock:
            self._remember(voice_id, voice)
        logger.info("voice %s added (%s, %.1f s, %d bytes, built for %s)", voice_id, name or "unnamed",
                    reference.duration, size, self.family)
        return info

    def build_clip(self, data: bytes) -> Voice:
        """A voice built from a clip for one request, kept nowhere: the checks of :meth:`add`
        (size, emptiness, the family's clip rules) and the same errors, without an id."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"a clip is bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > self.max_upload_bytes:
            raise VoiceUploadError(f"the clip is {len(data)} bytes; the limit is {self.max_upload_bytes} bytes",
                                   code="too_large")
        if not data:
            raise VoiceUploadError("the clip is empty (0 bytes); send an audio file", code="empty")
        if self.front_end is None:
            raise VoiceStoreError("the voice models are not loaded, so voices cannot be built here",
                                  code="voice_models_not_loaded")
        return _build_upload(self.front_end, data, name=f"clip-{upload_hash(data)[:ID_HEX_CHARS]}")[1]

    def get(self, voice_id: str) -> Voice:
        """The voice with this id, built for this family: ``default`` is the built-in voice;
        others come from the cache or, on a miss, from the store, where a voice kept as its
        clip and not yet built for this family is built now (and kept for every later use).

        Raises :class:`UnknownVoiceError` (:class:`InvalidVoiceIdError` for malformed ids), or
        :class:`VoiceStoreError` with code ``unusable_clip`` (this family's clip rules refuse
        the voice's clip), ``voice_models_not_loaded`` (a build is needed and there is no front
        end) or ``damaged_voice``."""
        if voice_id == DEFAULT_VOICE_ID:
            return self._require_builtin()
        check_voice_id(voice_id)
        with self._lock:
            voice = self._cache.get(voice_id)
        if voice is not None:
            if self.files.exists(record_name(voice_id)):
                with self._lock:
                    if voice_id in self._cache:
                        self._cache.move_to_end(voice_id)
                return voice
            self._forget(voice_id)  # deleted by another process
        record = self._require_record(voice_id)
        voice = self._load(voice_id, record)
        if voice is None:
            voice = self._build_family(voice_id, record)
        with self._lock:
            voice = self._cache.get(voice_id, voice)  # another thread may have loaded it meanwhile
            self._remember(voice_id, voice)
        return voice

    def info(self, voice_id: str) -> VoiceInfo:
        """Info of one voice (see :meth:`get` for the errors). Asking builds nothing."""
        if voice_id == DEFAULT_VOICE_ID:
            return self._builtin_info(self._require_builtin())
        check_voice_id(voice_id)
        return self._info(self._require_record(voice_id))

    def list(self) -> builtins.list[VoiceInfo]:
        """Every voice this store serves, oldest first; ``default`` first when there is a
        built-in voice. Read from the store, so voices added elsewhere appear."""
        infos = [] if self._builtin is None else [self._builtin_info(self._builtin)]
        infos += sorted((self._info(r) for r in self._voice_records()), key=lambda i: (i.created_at, i.id))
        return infos

    def delete(self, voice_id: str) -> bool:
        """Remove a voice for every family (record, clip, every built voice file, cache entry).
        Returns whether it existed. ``default`` raises :class:`ReservedVoiceError`; malformed ids
        :class:`InvalidVoiceIdError`; a voice of the old layout of another family is not seen."""
        if voice_id == DEFAULT_VOICE_ID:
            raise ReservedVoiceError("the built-in voice 'default' cannot be deleted")
        check_voice_id(voice_id)
        record = self._record(voice_id, warn=False)
        if record is not None and not self._serves(record):
            return False  # another variant's voice of the old layout: not ours to see or delete
        meta = record_name(voice_id)
        rest = [name for name in files_of(voice_id, self.files.listing()) if name != meta]
        # unpublish first: a crash in between leaves ignored files
        removed = self.files.delete(meta, *rest)
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

    def _serves(self, record: VoiceRecord) -> bool:
        """Whether this store sees the voice: every voice kept as its clip, and the old layout's
        voices of this family."""
        return record.keeps_clip or record.family == self.family

    def _info(self, record: VoiceRecord) -> VoiceInfo:
        """A voice's info as this store tells it: a voice kept as its clip is for this variant."""
        return replace(record.info, variant=self.variant.name) if record.keeps_clip else record.info

    def _voice_file(self, voice_id: str, record: VoiceRecord) -> str:
        """The name of the voice file this store loads for a voice."""
        return voice_name(voice_id, self.family if record.keeps_clip else None)

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
            self._unusable.pop(voice_id, None)
        self.files.uncache(voice_name(voice_id, None), voice_name(voice_id, self.family))

    def _warn_once(self, key: tuple[str, Any], message: str, *args: Any) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        logger.warning(message, *args)

    def _load(self, voice_id: str, record: VoiceRecord) -> Voice | None:
        """The voice file of ``voice_id`` for this store; None when a voice kept as its clip has
        not been built for this family yet."""
        name = self._voice_file(voice_id, record)
        try:
            return Voice.load(self.files.local_file(name))
        except FileNotFoundError:
            if record.keeps_clip:
                return None
            self._forget(voice_id)
            raise UnknownVoiceError(f"voice {voice_id!r} was deleted") from None
        except VoiceFormatError as exc:
            logger.error("voice %s: %s", voice_id, exc)
            self.files.uncache(name)
            raise VoiceStoreError(f"voice {voice_id!r} is damaged in {self.files.location} ({name}); delete it "
                                  "and upload its clip again", code="damaged_voice") from exc

    def _build_family(self, voice_id: str, record: VoiceRecord) -> Voice:
        """Build this family's voice file of a voice kept as its clip (its first use here)."""
        assert record.keeps_clip, "only voices kept as their clip are built on use"
        front_end = self.front_end
        if front_end is None:
            raise VoiceStoreError(f"voice {voice_id!r} has not been built for the {self.family} models yet, and the "
                                  "voice models are not loaded here to build it from its clip: load them, or use "
                                  "the voice once through a server of this variant that has them",
                                  code="voice_models_not_loaded")
        with self._lock:
            unusable = self._unusable.get(voice_id)
        if unusable is not None and unusable[0] == record.content_hash:
            raise VoiceStoreError(unusable[1], code="unusable_clip")  # the same clip: the same answer
        target = voice_name(voice_id, self.family)
        with self._build_lock:
            voice = self._load(voice_id, record)  # built meanwhile by another thread or process
            if voice is not None:
                return voice
            data = self._read_clip(voice_id, record)
            try:
                voice = front_end.build(front_end.prepare(data), name=record.info.name or voice_id)
            except AudioError as exc:
                message = (f"voice {voice_id!r} cannot be used with the {self.variant.name} variant: {exc} (its clip "
                           f"suited {record.info.variant}); upload a clip that suits {self.variant.name} to speak "
                           "with it here")
                with self._lock:
                    self._unusable[voice_id] = (record.content_hash, message)
                raise VoiceStoreError(message, code="unusable_clip") from exc
            try:
                # another store or process may write the same file now: identical content
                self.files.write_file(target, voice.save)
            except OSError as exc:
                if exc.errno not in STORAGE_FULL:
                    raise
                logger.warning("voice store %s is out of space (%s): voice %s, built for %s, is served from "
                               "memory and will be built again once evicted", self.files.location,
                               os.strerror(exc.errno), voice_id, self.family)
                return voice
        logger.info("voice %s built for %s from its clip", voice_id, self.family)
        return voice

    def _read_clip(self, voice_id: str, record: VoiceRecord) -> bytes:
        """The kept clip of a voice, checked against its record."""
        name = clip_name(voice_id)
        try:
            data = self.files.read(name)
        except FileNotFoundError:
            if self._record(voice_id, warn=False) is None:
                self._forget(voice_id)
                raise UnknownVoiceError(f"voice {voice_id!r} was deleted") from None
            data = None
        if data is None or upload_hash(data) != record.content_hash:
            what = "is missing" if data is None else "does not match its record"
            raise VoiceStoreError(f"voice {voice_id!r} cannot be built for {self.family}: its clip {name} {what} in "
                                  f"{self.files.location}; delete the voice and upload its clip again",
                                  code="damaged_voice")
        return data

    def _record(self, voice_id: str, *, warn: bool = True, listing: dict[str, Stamp] | None = None
                ) -> VoiceRecord | None:
        """The published record of ``voice_id`` (for the old layout: whose voice file exists),
        else None. ``listing``: stamps from a listing of the store, instead of asking for them
        one by one."""
        meta = record_name(voice_id)
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
        if record.keeps_clip:
            return record  # published: the record is written last
        voice_file = voice_name(voice_id, None)
        has_voice = self.files.stamp(voice_file) is not None if listing is None else voice_file in listing
        if not has_voice:
            if warn:
                self._warn_once((voice_id, "orphan-record", stamp), "voice store %s: %s has no voice file %s; "
                                "skipped", self.files.location, meta, voice_file)
            return None
        return record

    def _parse(self, voice_id: str, stamp: Stamp, warn: bool) -> VoiceRecord | None:
        meta = record_name(voice_id)
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
        if not self._serves(record):
            raise UnknownVoiceError(f"voice {voice_id!r} was built for the {record.info.variant} variant; "
                                    f"this server runs {self.variant.name}: upload the clip again here")
        return record

    def _voice_records(self) -> builtins.list[VoiceRecord]:
        """Records of the voices this store serves, from one listing of the store."""
        listing = self.files.listing()
        records = []
        for voice_id in _record_ids(listing):
            record = self._record(voice_id, listing=listing)
            if record is not None and self._serves(record):
                records.append(record)
        return records

    def _existing(self, voice_id: str, digest: str) -> VoiceInfo | None:
        record = self._record(voice_id, warn=False)
        if record is None:
            return None
        if record.content_hash != digest:
            raise VoiceStoreError(f"voice id {voice_id} is taken by a different clip (a hash prefix collision)",
                                  code="id_collision")
        return self._info(record)

    def _publish(self, voice_id: str, record: dict[str, Any]) -> VoiceInfo:
        """Create the metadata record unless another writer already did; returns the info of the
        record that won."""
        meta = record_name(voice_id)
        data = json.dumps(record, indent=1).encode("utf-8")
        if not self.files.create(meta, data):  # the first writer wins
            existing = self._record(voice_id, warn=False)
            if existing is not None:
                if existing.content_hash != record["content_hash"]:
                    raise VoiceStoreError(f"voice id {voice_id} is taken by a different clip", code="id_collision")
                return self._info(existing)
            self.files.write(meta, data)  # a damaged record: ours replaces it
        published = self._record(voice_id, warn=False)
        return record_info(record) if published is None else self._info(published)  # None: deleted again already

    def _scan(self) -> None:
        """Look at every file once at startup: warn about (and skip) what is not a complete voice,
        remove temporaries left by interrupted writes long ago. Never fails on one bad file."""
        self.files.sweep()
        listing = self.files.listing()
        where = self.files.location
        count = 0
        for name in sorted(listing):
            try:
                parsed = parse_name(name)
                if parsed is None:
                    if name.endswith(RECORD_SUFFIX):
                        logger.warning("voice store %s: %s is not named after a voice id; skipped", where, name)
                    else:
                        logger.warning("voice store %s: ignoring %s, which is not part of a voice", where, name)
                elif parsed.kind == "record":
                    record = self._record(parsed.voice_id, listing=listing)
                    if record is not None and self._serves(record):
                        count += 1
                    if record is not None and record.keeps_clip and clip_name(parsed.voice_id) not in listing:
                        logger.warning("voice store %s: %s has no clip %s; families that have not built it "
                                       "cannot use it", where, name, clip_name(parsed.voice_id))
                elif record_name(parsed.voice_id) not in listing:
                    logger.warning("voice store %s: %s has no metadata record (an interrupted upload or "
                                   "delete); skipped", where, name)
            except Exception as exc:  # one bad file never stops the store
                logger.warning("voice store %s: skipping %s: %s", where, name, exc)
        logger.info("voice store %s: %d voices for %s", where, count, self.family)


def _build_upload(front_end: "VoiceFrontEnd", data: bytes, *, name: str) -> "tuple[ReferenceAudio, Voice]":
    """Validate and build an upload, mapping unusable audio to :class:`VoiceUploadError`."""
    try:
        reference = front_end.prepare(data)
        return reference, front_end.build(reference, name=name)
    except ReferenceAudioError as exc:
        code = exc.reason if exc.reason in ("empty", "too_short", "silent") else "invalid_audio"
        raise VoiceUploadError(str(exc), code=code) from exc
    except AudioTooLongError as exc:
        raise VoiceUploadError(str(exc), code="too_long") from exc
    except AudioError as exc:  # AudioDecodeError and any other unusable audio
        raise VoiceUploadError(str(exc), code="invalid_audio") from exc


def _record_ids(listing: dict[str, Stamp]) -> builtins.list[str]:
    parsed = (parse_name(name) for name in listing)
    return [p.voice_id for p in parsed if p is not None and p.kind == "record"]
