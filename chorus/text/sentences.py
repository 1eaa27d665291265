"""Sentence boundaries of one paragraph, found by the ``sentencex`` segmenter.

``sentencex`` (Wikimedia, MIT, a Rust extension) knows abbreviations, initials, decimals and
quotes for ~300 languages and falls back along language families for the rest, so all 23
Chatterbox languages get rules. See docs/text.md for why it was chosen over ``pysbd``.

Two things are added on top of it:

* a sentence that ends in a single upper-case letter and a full stop (French ``M.``, an initial)
  is joined to the next one: a missed boundary only makes a chunk a little longer, a wrong one
  can put a chunk break inside a name;
* a panic inside the extension (it has had byte-offset bugs on some multi-byte input) or an
  answer that does not reassemble to the input is never passed on: the paragraph is then
  returned as one sentence, which the chunker still cuts at clauses or spaces.
"""
from __future__ import annotations

import logging
import re

import sentencex

from chorus.text.languages import normalize_language

logger = logging.getLogger(__name__)

DEFAULT_LANGUAGE = "en"

# one upper-case letter after a non-word character (or the start), a full stop, then whitespace
_ENDS_IN_INITIAL = re.compile(r"(?:^|\W)([^\W\d_])\.\s*$")


def sentence_language(language: str | None) -> str:
    """The language code used for segmentation: ``None`` means English; others are validated.

    Raises ``UnsupportedLanguageError`` for a code outside the 23 Chatterbox languages.
    """
    return DEFAULT_LANGUAGE if language is None else normalize_language(language)


def _is_panic(exc: BaseException) -> bool:
    # pyo3 panics derive from BaseException; only that type is caught, never KeyboardInterrupt,
    # SystemExit or a cancellation.
    return type(exc).__name__ == "PanicException"


def _segment(paragraph: str, language: str) -> list[str]:
    try:
        sentences = list(sentencex.segment(language, paragraph))
    except BaseException as exc:  # noqa: BLE001 - see _is_panic
        if not isinstance(exc, Exception) and not _is_panic(exc):
            raise
        logger.warning("sentence segmenter failed (%s: %s); keeping the paragraph whole",
                       type(exc).__name__, str(exc)[:200])
        return [paragraph]
    if "".join(sentences) != paragraph:
        logger.warning("sentence segmenter lost characters; keeping the paragraph whole")
        return [paragraph]
    return sentences


def _join_initials(sentences: list[str]) -> list[str]:
    joined: list[str] = []
    for sentence in sentences:
        initial = _ENDS_IN_INITIAL.search(joined[-1]) if joined else None
        if initial and initial.group(1).isupper():
            joined[-1] += sentence
        else:
            joined.append(sentence)
    return joined


def split_sentences(paragraph: str, language: str | None = None) -> list[str]:
    """Sentences of one paragraph, in order, each keeping the whitespace that followed it.

    ``"".join(split_sentences(p)) == p`` always holds. ``language`` is a Chatterbox language
    code (``None``: English).
    """
    if not isinstance(paragraph, str):
        raise TypeError(f"paragraph must be a str, got {type(paragraph).__name__}")
    if not paragraph:
        return []
    return _join_initials(_segment(paragraph, sentence_language(language)))
