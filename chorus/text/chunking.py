"""Sentence-level chunking of long text.

T3 is trained on utterances of a sentence or a few, so long input is cut into chunks that each
get their own synthesis. Rules, in order:

1. blank lines end a paragraph, and a chunk never spans two paragraphs;
2. inside a paragraph, whitespace runs become single spaces;
3. sentences end at ``. ! ? …`` (and Arabic ``؟``, Devanagari ``। ॥``) followed by whitespace or
   the end, or at CJK ``。！？`` anywhere; closing quotes and brackets stay with their sentence;
   a full stop after a known abbreviation or a single letter (``Dr.``, ``J. R. R.``), or one
   followed by a lower-case word, does not end a sentence;
4. a sentence longer than ``max_chars`` is cut at the last clause mark (``, ; : — –`` and CJK
   ``，、；：``) that leaves a reasonably long first piece, else at the last space, else hard;
5. consecutive sentences are packed greedily into chunks of at most ``max_chars`` characters.

No character other than whitespace is ever dropped.
"""
from __future__ import annotations

import re

# About 25 s of English speech (~650 speech tokens), well inside T3's 1000-token budget.
DEFAULT_MAX_CHARS = 400
MIN_MAX_CHARS = 20

_CLOSERS = "\"'\u201d\u2019\u00bb)]\u300d\u300f\u3011\u3015\uff09"
_CLOSER_CLASS = "[" + re.escape(_CLOSERS) + "]*"
_SENTENCE_END = re.compile(
    r"[.!?\u2026\u061f\u0964\u0965]+" + _CLOSER_CLASS + r"(?=\s|$)"  # needs a following space or the end
    r"|[\u3002\uff01\uff1f]+" + _CLOSER_CLASS  # CJK: no space follows
)
_CLAUSE_MARK = re.compile(r"[,;:\u2014\u2013](?=\s)|[\uff0c\u3001\uff1b\uff1a]")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf no vol fig approx dept est inc ltd co corp "
    "mt ft gen col lt sgt capt".split()
)


def _ends_sentence(paragraph: str, match: re.Match) -> bool:
    if paragraph[match.start()] in "\u3002\uff01\uff1f":
        return True
    following = paragraph[match.end():].lstrip()
    if following[:1].islower():
        return False
    marks = match.group().rstrip(_CLOSERS)
    if marks == ".":
        word = paragraph[: match.start()].rsplit(None, 1)[-1] if paragraph[: match.start()].strip() else ""
        word = word.lstrip(_CLOSERS + "([\"'\u201c\u2018\u00ab")
        if word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
            return False
    return True


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph, each keeping the whitespace that followed it."""
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(paragraph):
        if match.end() <= start or not _ends_sentence(paragraph, match):
            continue
        end = match.end()
        while end < len(paragraph) and paragraph[end].isspace():
            end += 1
        sentences.append(paragraph[start:end])
        start = end
    if start < len(paragraph):
        sentences.append(paragraph[start:])
    return sentences


def _cut_position(text: str, max_chars: int) -> int:
    window = text[: max_chars + 1]
    floor = max_chars // 3  # a clause cut must leave at least this much in the first piece
    clause_cuts = [m.end() for m in _CLAUSE_MARK.finditer(window) if floor <= m.end() <= max_chars]
    if clause_cuts:
        return clause_cuts[-1]
    space = window.rfind(" ")
    if space > 0:
        return space + 1
    return max_chars


def split_long_sentence(sentence: str, max_chars: int) -> list[str]:
    """Pieces of at most ``max_chars`` characters (ignoring trailing whitespace)."""
    pieces = []
    while len(sentence.rstrip()) > max_chars:
        cut = _cut_position(sentence, max_chars)
        pieces.append(sentence[:cut])
        sentence = sentence[cut:]
    if sentence.strip():
        pieces.append(sentence)
    return pieces


def split_into_chunks(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Cut ``text`` into sentence-aligned chunks of at most ``max_chars`` characters.

    Chunks are stripped and have single spaces; an empty or whitespace-only text gives ``[]``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(max_chars, int) or max_chars < MIN_MAX_CHARS:
        raise ValueError(f"max_chars must be an integer of at least {MIN_MAX_CHARS}, got {max_chars!r}")
    chunks: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        current = ""
        for sentence in split_sentences(paragraph):
            for piece in split_long_sentence(sentence, max_chars):
                if current and len((current + piece).rstrip()) > max_chars:
                    chunks.append(current.strip())
                    current = ""
                current += piece
        if current.strip():
            chunks.append(current.strip())
    return chunks
