"""What the voice store knows and says: ids, the metadata record of a voice, and its errors.

A voice's id is a content address: the first :data:`ID_HEX_CHARS` hex digits of the SHA-256 of
the uploaded bytes together with the variant *family* (variants whose voices are
interchangeable, see :func:`variant_family`), so the same clip gets the same id on every
machine. Its record (``<id>.json``, format :data:`METADATA_FORMAT`) holds id, name, created_at,
duration_s, variant, family, content_hash, voice_hash and bytes.
"""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Hashable

from chorus.voices.voice import voices_interchangeable

if TYPE_CHECKING:
    from chorus.models.variants import Variant

DEFAULT_VOICE_ID = "default"
METADATA_FORMAT = "chorus-voice-record/1"
ID_HEX_CHARS = 16  # 64 bits of SHA-256: collisions are out of reach for any voice library
MAX_ID_CHARS = 64
MAX_NAME_CHARS = 128
ID_RE = re.compile(rf"[a-z0-9_-]{{1,{MAX_ID_CHARS}}}")
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
class VoiceRecord:
    """A parsed metadata record. stamp: what the record file looked like when it was read
    (see :data:`chorus.voices.blobs.Stamp`), so it is parsed again only when it changes."""

    info: VoiceInfo
    family: str
    content_hash: str
    stamp: Hashable


def parse_record(data: bytes, voice_id: str, stamp: Hashable) -> VoiceRecord:
    """The record of ``voice_id`` in ``data``; raises ValueError (or KeyError, TypeError) when
    it is not one."""
    raw = json.loads(data.decode("utf-8"))
    if not isinstance(raw, dict) or raw.get("format") != METADATA_FORMAT or raw.get("id") != voice_id:
        raise ValueError(f"not a {METADATA_FORMAT} record of {voice_id}")
    name, duration = raw.get("name"), raw.get("duration_s")
    info = VoiceInfo(id=voice_id, name=None if name is None else str(name), created_at=float(raw["created_at"]),
                     duration_s=None if duration is None else float(duration), variant=str(raw["variant"]))
    family = str(raw.get("family") or variant_family(info.variant))
    return VoiceRecord(info=info, family=family, content_hash=str(raw["content_hash"]), stamp=stamp)


def record_info(record: dict[str, Any]) -> VoiceInfo:
    """The info of a record about to be written (see ``VoiceStore.add``)."""
    return VoiceInfo(id=record["id"], name=record["name"], created_at=record["created_at"],
                     duration_s=record["duration_s"], variant=record["variant"])


# ---------------------------------------------------------------------------------- ids, names

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
