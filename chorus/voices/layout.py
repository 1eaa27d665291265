"""The names of a voice store's files, and how to read a name back.

Every file of a voice is named after its id (see :mod:`chorus.voices.records`)::

    <id>.json                    the metadata record (publishes the voice)
    <id>.clip                    the uploaded clip, byte for byte (record format 2)
    <id>.<family>.safetensors    the voice built from the clip for one variant family (format 2)
    <id>.safetensors             the voice of a format-1 record (the old layout: one family)

Ids and family names are ``[a-z0-9_-]``, so a name has at most two dots and reads back
unambiguously. Temporaries of writes in progress are hidden (a leading dot) and never named here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from chorus.voices.records import DEFAULT_VOICE_ID, ID_RE
from chorus.voices.voice import VOICE_FILE_SUFFIX

RECORD_SUFFIX = ".json"
CLIP_SUFFIX = ".clip"
FAMILY_RE = re.compile(r"[a-z0-9_-]{1,64}")

Kind = Literal["record", "clip", "voice"]


def record_name(voice_id: str) -> str:
    return f"{voice_id}{RECORD_SUFFIX}"


def clip_name(voice_id: str) -> str:
    return f"{voice_id}{CLIP_SUFFIX}"


def voice_name(voice_id: str, family: str | None) -> str:
    """The voice file of ``voice_id`` built for ``family``; None: the old layout's single file."""
    if family is None:
        return f"{voice_id}{VOICE_FILE_SUFFIX}"
    assert FAMILY_RE.fullmatch(family), f"a variant family name must match {FAMILY_RE.pattern}: {family!r}"
    return f"{voice_id}.{family}{VOICE_FILE_SUFFIX}"


@dataclass(frozen=True)
class FileName:
    """What a file name says: the voice it belongs to, what it holds and, for a voice file of
    the new layout, the family it was built for (None: a record, a clip or an old voice file)."""

    voice_id: str
    kind: Kind
    family: str | None = None


def parse_name(name: str) -> FileName | None:
    """The meaning of a file name in the store, None when it is no voice's file."""
    if name.endswith(RECORD_SUFFIX):
        stem, kind = name[: -len(RECORD_SUFFIX)], "record"
    elif name.endswith(CLIP_SUFFIX):
        stem, kind = name[: -len(CLIP_SUFFIX)], "clip"
    elif name.endswith(VOICE_FILE_SUFFIX):
        stem, kind = name[: -len(VOICE_FILE_SUFFIX)], "voice"
    else:
        return None
    family = None
    if kind == "voice" and "." in stem:
        stem, family = stem.split(".", 1)
        if not FAMILY_RE.fullmatch(family):
            return None
    if not ID_RE.fullmatch(stem) or stem == DEFAULT_VOICE_ID:
        return None
    return FileName(stem, kind, family)


def files_of(voice_id: str, names) -> list[str]:
    """The names among ``names`` that belong to ``voice_id``, the record first (so that removing
    them in this order unpublishes the voice before anything else goes)."""
    own = [name for name in names if (parsed := parse_name(name)) is not None and parsed.voice_id == voice_id]
    return sorted(own, key=lambda name: (parse_name(name).kind != "record", name))
