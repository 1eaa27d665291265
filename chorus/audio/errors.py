"""Errors raised for unusable audio input; the server maps all of them to HTTP 400."""
from __future__ import annotations


class AudioError(ValueError):
    """Base class: the audio a user supplied cannot be used."""


class AudioDecodeError(AudioError):
    """The bytes are not audio we can decode (corrupt, truncated, unknown container or codec)."""


class AudioTooLongError(AudioDecodeError):
    """The audio is longer than the caller accepts at all (e.g. a decompression bomb: a small
    file that decodes to hours). Found from the header when it states a length, else while
    decoding, which stops there; the samples past the limit are never kept."""


class ReferenceAudioError(AudioError):
    """Decodable audio that is unusable as a voice reference (empty, silent, too short).

    ``reason`` says which, for callers that answer with a machine-readable code: ``"empty"`` (no
    samples), ``"too_short"`` (below the general or the variant's minimum) or ``"silent"``.
    """

    def __init__(self, message: str, *, reason: str = "unusable"):
        super().__init__(message)
        self.reason = reason
