"""Chorus: a serving engine for the Chatterbox TTS family."""

__version__ = "0.1.0"
