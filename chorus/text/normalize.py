"""Punctuation clean-up applied to every text before tokenisation.

This reproduces the reference's ``punc_norm`` (one copy per entry class, three slightly different
rule sets) including its quirks, because T3 was trained on text prepared this way:

* the first character is upper-cased *before* whitespace is collapsed, so text starting with a
  space keeps its lower-case first letter;
* whitespace runs are collapsed *before* the replacements, which may create new double spaces
  (``"a ... b"`` -> ``"a ,  b"``) that stay;
* empty text becomes a fixed English sentence; whitespace-only text becomes ``"."``.
"""
from __future__ import annotations

from typing import Literal

PunctuationStyle = Literal["en", "mtl", "turbo"]
PUNCTUATION_STYLES: tuple[str, ...] = ("en", "mtl", "turbo")

EMPTY_TEXT_REPLACEMENT = "You need to add some text for me to talk."

# Shared tail of every rule list: dashes to hyphens, a space before a comma dropped,
# typographic quotes to ASCII.
_DASHES_AND_QUOTES: tuple[tuple[str, str], ...] = (
    ("\u2014", "-"),  # em dash
    ("\u2013", "-"),  # en dash
    (" ,", ","),
    ("\u201c", '"'),
    ("\u201d", '"'),
    ("\u2018", "'"),
    ("\u2019", "'"),
)
# Applied in order; order matters ("..." must go before ":" and ";" rules see the result).
_FULL_RULES: tuple[tuple[str, str], ...] = (
    ("...", ", "),
    ("\u2026", ", "),  # horizontal ellipsis
    (":", ","),
    (" - ", ", "),
    (";", ", "),
) + _DASHES_AND_QUOTES
# Turbo keeps "...", " - " and ";" as they are.
_TURBO_RULES: tuple[tuple[str, str], ...] = (
    ("\u2026", ", "),
    (":", ","),
) + _DASHES_AND_QUOTES

_LATIN_ENDINGS: tuple[str, ...] = (".", "!", "?", "-", ",")
_CJK_ENDINGS: tuple[str, ...] = ("\u3001", "\uff0c", "\u3002", "\uff1f", "\uff01")  # 、，。？！

_RULES: dict[str, tuple[tuple[str, str], ...]] = {"en": _FULL_RULES, "mtl": _FULL_RULES, "turbo": _TURBO_RULES}
_ENDINGS: dict[str, tuple[str, ...]] = {
    "en": _LATIN_ENDINGS,
    "mtl": _LATIN_ENDINGS + _CJK_ENDINGS,
    "turbo": _LATIN_ENDINGS,
}


def normalize_punctuation(text: str, style: PunctuationStyle) -> str:
    """Clean ``text`` the way the reference does for variants of punctuation ``style``.

    ``style`` is ``Variant.punctuation``: ``"en"`` (original), ``"mtl"`` (multilingual: also
    accepts CJK sentence endings) or ``"turbo"`` (turbo/nano: fewer replacements).
    """
    if style not in _RULES:
        raise ValueError(f"unknown punctuation style {style!r}; choose one of: {', '.join(PUNCTUATION_STYLES)}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        return EMPTY_TEXT_REPLACEMENT
    if text[0].islower():
        text = text[0].upper() + text[1:]
    text = " ".join(text.split())
    for old, new in _RULES[style]:
        text = text.replace(old, new)
    text = text.rstrip(" ")
    if not text.endswith(_ENDINGS[style]):
        text += "."
    return text
