"""What the voice store knows and says: ids, the metadata record of a voice, and its errors.

A voice's id is a content address: the first :data:`ID_HEX_CHARS` hex digits of the SHA-256 of
the uploaded bytes (:func:`upload_hash`), so the same clip gets the same id on every machine and
for every model. Its record (``<id>.json``) is one of two formats:

* :data:`METADATA_FORMAT` (``chorus-voice-record/2``, written now): a voice kept as its clip and
  usable by every variant family, each building it from the clip on first use. Fields: format,
  id, name, created_at, duration_s, content_hash, bytes, and ``first_build`` (``variant``,
  ``family`` and ``voice_hash`` of the build that validated the upload).
* :data:`LEGACY_METADATA_FORMAT` (``chorus-voice-record/1``, read only): a voice of one variant
  family, whose id also hashed the family (:func:`family_upload_hash`). Fields: format, id, name,
  created_at, duration_s, variant, family, content_hash, voice_hash and bytes.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable

from chorus.voices.voice import voices_interchangeable

if TYPE_CHECKING:
    from chorus.models.variants import Variant

DEFAULT_VOICE_ID = "default"
METADATA_FORMAT = "chorus-voice-record/2"  # what the store writes
LEGACY_METADATA_FORMAT = "chorus-voice-record/1"  # voices of one family, read as before
ID_HEX_CHARS = 16  # 64 bits of SHA-256: collisions are out of reach for any voice library
MAX_ID_CHARS = 64
MAX_NAME_CHARS = 128
ID_RE = re.compile(rf"[a-z0-9_-]{{1,{MAX_ID_CHARS}}}")
_HASH_DOMAIN = b"chorus-voice-upload/2\0"  # ids of format-2 voices: the clip alone
_FAMILY_HASH_DOMAIN = b"chorus-voice-upload/1\0"  # ids of format-1 voices: the clip and a family


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
    (under 0.5 s, or the variant's own minimum), ``too_long`` (over 10 minutes of audio, e.g. a
    decompression bomb: refused before it is decoded), ``silent``, ``invalid_name``,
    ``too_many_voices`` (the store holds ``max_voices`` voices).
    """

    code = "invalid_audio"


# ------------------------------------------------------------------------------------ records

@dataclass(frozen=True)
class VoiceInfo:
    """What the store tells about a voice.

    created_at: seconds since the epoch (0.0 for the built-in voice). duration_s: length of the
    clip the voice is built from, after the 60 s cut (None for the built-in voice). variant: the
    variant the voice is for where it was asked about: a store answers with its own variant for
    a voice kept as its clip (built for it on first use), and with the variant a voice of the
    old layout was built for.
    """

    id: str
    name: str | None
    created_at: float
    duration_s: float | None
    variant: str


@dataclass(frozen=True)
class VoiceRecord:
    """A parsed metadata record of either format.

    family: for a format-1 record, the one variant family the voice serves; None for a format-2
    record, whose clip serves every family. info.variant: the variant the voice was built for
    (format 1) or first built for (format 2). stamp: what the record file looked like when it
    was read (see :data:`chorus.voices.blobs.Stamp`), so it is parsed again only when it changes.
    """

    info: VoiceInfo
    family: str | None
    content_hash: str
    stamp: Hashable

    @property
    def keeps_clip(self) -> bool:
        """Whether the voice is kept as its clip (format 2) rather than as one built voice."""
        return self.family is None


def parse_record(data: bytes, voice_id: str, stamp: Hashable) -> VoiceRecord:
    """The record of ``voice_id`` in ``data``, of either format; raises ValueError (or KeyError,
    TypeError) when it is not one."""
    raw = json.loads(data.decode("utf-8"))
    if not isinstance(raw, dict) or raw.get("id") != voice_id:
        raise ValueError(f"not a voice record of {voice_id}")
    if raw.get("format") == METADATA_FORMAT:
        first = raw["first_build"]
        if not isinstance(first, dict):
            raise ValueError(f"first_build of {voice_id} is not an object")
        variant, family = str(first["variant"]), None
    elif raw.get("format") == LEGACY_METADATA_FORMAT:
        variant = str(raw["variant"])
        family = str(raw.get("family") or variant_family(variant))
    else:
        raise ValueError(f"{raw.get('format')!r} is not a voice record format ({METADATA_FORMAT} or "
                         f"{LEGACY_METADATA_FORMAT})")
    name, duration = raw.get("name"), raw.get("duration_s")
    info = VoiceInfo(id=voice_id, name=None if name is None else str(name), created_at=float(raw["created_at"]),
                     duration_s=None if duration is None else float(duration), variant=variant)
    return VoiceRecord(info=info, family=family, content_hash=str(raw["content_hash"]), stamp=stamp)


def new_record(voice_id: str, *, name: str | None, duration_s: float, content_hash: str, size: int,
               variant: str, voice_hash: str) -> dict[str, Any]:
    """A format-2 record of a clip just uploaded and built for ``variant`` (see ``VoiceStore.add``)."""
    assert content_hash.startswith(voice_id), "a voice's id is the start of its content hash"
    return {
        "format": METADATA_FORMAT, "id": voice_id, "name": name, "created_at": time.time(),
        "duration_s": round(duration_s, 3), "content_hash": content_hash, "bytes": size,
        "first_build": {"variant": variant, "family": variant_family(variant), "voice_hash": voice_hash},
    }


def record_info(record: dict[str, Any]) -> VoiceInfo:
    """The info of a format-2 record about to be written (see :func:`new_record`)."""
    assert record["format"] == METADATA_FORMAT
    return VoiceInfo(id=record["id"], name=record["name"], created_at=record["created_at"],
                     duration_s=record["duration_s"], variant=record["first_build"]["variant"])


# ---------------------------------------------------------------------------------- ids, names

def variant_family(variant: "Variant | str") -> str:
    """The name that all variants sharing voices with ``variant`` agree on (the first of them in
    the variant table): ``multilingual`` for multilingual v2 and v3, else the variant's own name."""
    from chorus.models.variants import VARIANTS

    name = variant if isinstance(variant, str) else variant.name
    if name not in VARIANTS:
        return name
    return next(candidate for candidate in VARIANTS if voices_interchangeable(candidate, name))


def upload_hash(data: bytes) -> str:
    """SHA-256 (hex) of an upload, domain-separated; a voice's id is its first characters. The
    same for every variant family (the voice is built per family from the kept clip)."""
    h = hashlib.sha256(_HASH_DOMAIN)
    h.update(data)
    return h.hexdigest()


def family_upload_hash(data: bytes, family: str) -> str:
    """The hash that ids of format-1 voices (one family each) are the start of: SHA-256 of an
    upload together with its variant family, under another domain than :func:`upload_hash`, so
    the two kinds of id never meet. The store no longer makes such ids; it reads their voices."""
    h = hashlib.sha256(_FAMILY_HASH_DOMAIN)
    h.update(family.encode("utf-8") + b"\0")
    h.update(data)
    return h.hexdigest()


def check_voice_id(voice_id: Any) -> str:
    """Return ``voice_id`` if it has the form of an id, else raise :class:`InvalidVoiceIdError`."""
    if not isinstance(voice_id, str) or not ID_RE.fullmatch(voice_id):
        shown = repr(voice_id) if len(repr(voice_id)) <= 80 else repr(voice_id)[:77] + "..."
        raise InvalidVoiceIdError(f"{shown} is not a voice id: ids are 1-{MAX_ID_CHARS} characters of "
                                  "a-z, 0-9, '_' and '-'")
    return voice_id


def check_name(name: Any) -> str | None:
    """A voice's name, stripped (None when blank); raises :class:`VoiceUploadError`."""
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
