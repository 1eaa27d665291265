"""Exceptions raised by the text front end.

All of them derive from ``TextError`` so a server can map the whole family to a 400/500 answer
with one ``except`` clause; each also derives from the built-in exception a caller would expect.
"""
from __future__ import annotations


class TextError(Exception):
    """Base class of every text front-end error."""


class TextInputError(TextError, ValueError):
    """The caller's text or its options are unusable (wrong type, empty, bad language...)."""


class UnsupportedLanguageError(TextInputError):
    """A language code the variant does not speak, or a missing one where it is required."""


class MissingLanguagePackageError(TextError, ImportError):
    """A language needs an optional Python package that is not installed."""


class LanguagePreprocessingError(TextError, RuntimeError):
    """An installed per-language preprocessor failed on this text."""


class TokenizerFileError(TextError, OSError):
    """A tokenizer file is missing, unreadable or inconsistent with what the variant needs."""


class LanguageModelMissingError(TextError, FileNotFoundError):
    """A language step's model file (Dicta's ONNX model, a pkuseg model) cannot be found or fetched."""
