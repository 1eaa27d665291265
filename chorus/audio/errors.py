"""Errors raised for unusable audio input; the server maps all of them to HTTP 400."""
from __future__ import annotations


class AudioError(ValueError):
    """Base class: the audio a user supplied cannot be used."""


class AudioDecodeError(AudioError):
    """The bytes are not audio we can decode (corrupt, truncated, unknown container or codec)."""


class ReferenceAudioError(AudioError):
    """Decodable audio that is unusable as a voice reference (empty, silent, too short)."""
