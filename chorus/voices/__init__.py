"""Voices: reference clip -> conditioning for T3 and S3Gen.

``Voice`` imports eagerly; the builder and the voice store (which need the audio stack) load on
first use, so the T3 engine does not depend on audio decoding libraries.
"""
from chorus.voices.voice import S3GenPrompt, Voice, VoiceFormatError

_BUILDER_NAMES = ("VoiceFrontEnd", "build_voice", "prepare_voice_audio", "s3gen_prompt")
_STORE_NAMES = ("VoiceStore", "VoiceInfo", "VoiceStoreError", "UnknownVoiceError", "InvalidVoiceIdError",
                "ReservedVoiceError", "VoiceUploadError")

__all__ = ["S3GenPrompt", "Voice", "VoiceFormatError", *_BUILDER_NAMES, *_STORE_NAMES]


def __getattr__(name: str):
    if name in _BUILDER_NAMES:
        from chorus.voices import builder

        return getattr(builder, name)
    if name in _STORE_NAMES:
        from chorus.voices import store

        return getattr(store, name)
    raise AttributeError(f"module 'chorus.voices' has no attribute {name!r}")
