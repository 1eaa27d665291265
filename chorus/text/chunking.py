"""Sentence-level chunking of long text.

T3 is trained on utterances of a sentence or a few, so long input is cut into chunks that each
get their own synthesis. Rules, in order:

1. blank lines end a paragraph, and a chunk never spans two paragraphs;
2. inside a paragraph, whitespace runs become single spaces;
3. sentences come from :func:`chorus.text.sentences.split_sentences` (``sentencex``, per language);
4. a sentence longer than ``max_chars`` is cut into the fewest pieces that fit, each cut placed
   near an equal share of the length (balanced, so no tiny tail): at a clause mark
   (``, ; : — –``, a hyphen standing alone between spaces or a run of two or more hyphens as
   typed dashes, Arabic ``، ؛``, CJK ``，、；：``) when one lies close enough, else at the space
   nearest the share, else (a single "word" longer than the bound, e.g. CJK text without spaces)
   between two characters, never inside a Latin-script word, a combining sequence or an emoji
   sequence when that can be avoided;
5. consecutive sentences and pieces are packed into the fewest chunks of at most ``max_chars``
   that the paragraph allows, with the longest of them as short as it can be (balanced: a
   paragraph of 900 characters at a bound of 400 gives three chunks of about 300, not
   400 + 400 + 100). Chunks of one request run side by side, so the longest sets its time.

No character other than whitespace is ever dropped or repeated, and the order is kept.
"""
from __future__ import annotations

import math
import re
import unicodedata

from chorus.text.sentences import sentence_language, split_sentences

# About 14 s of English speech (~360 speech tokens). A request's chunks run side by side, so its
# longest chunk sets its time: turbo's benchmark text took 1.67 / 1.63 / 1.79 s at 200 / 225 / 250
# characters (docs/decisions.md, "Text chunks default to at most 225 characters"), at the cost of
# cutting 58 of the text's 215 sentences at clauses.
DEFAULT_MAX_CHARS = 225
MIN_MAX_CHARS = 20

# A mark ending a clause; the cut goes right after it. ASCII-style marks need a following space
# (so "3:30", "1,000" and "10–20" stay whole); the em dash and CJK/Arabic marks need none.
# Plain-text dashes count too (" - ", "--"): the original and multilingual punctuation clean-up
# turns " - " into a comma, so T3 reads a clause break there anyway; "well-known" stays whole.
CLAUSE_MARK = re.compile(
    r"[,;:\u2013](?=\s)|\u2014|(?<=\s)-(?=\s)|-{2,}|[\u060c\u061b\uff0c\u3001\uff1b\uff1a]")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# A clause cut may leave the first piece this much shorter than an equal share.
_CLAUSE_SLACK = 0.5
_JOINERS = frozenset("\u200c\u200d\u2060\ufeff")  # ZWNJ, ZWJ, word joiner, BOM


def is_scriptio_continua(char: str) -> bool:
    """Scripts written without spaces between words, where a cut between characters is fine."""
    code = ord(char)
    return (
        0x2E80 <= code <= 0x9FFF  # CJK radicals, punctuation, kana, ideographs
        or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF
        or 0x20000 <= code <= 0x3FFFF  # CJK extensions
        or 0x0E00 <= code <= 0x0EFF or 0x1000 <= code <= 0x109F  # Thai, Lao, Myanmar
    )


def _glued(left: str, right: str) -> bool:
    """True when cutting between ``left`` and ``right`` would break a word or a grapheme."""
    if right in _JOINERS or left in _JOINERS:
        return True
    category = unicodedata.category(right)
    if category[0] == "M" or category == "Sk" or 0xFE00 <= ord(right) <= 0xFE0F or 0x1F3FB <= ord(right) <= 0x1F3FF:
        return True  # combining mark, modifier, variation selector, skin tone
    if 0xDC00 <= ord(right) <= 0xDFFF:
        return True  # low surrogate (only in malformed text)
    return (left.isalnum() and right.isalnum()
            and not (is_scriptio_continua(left) or is_scriptio_continua(right)))


def _hard_cut(text: str, want: int) -> int:
    for cut in range(want, 0, -1):
        if not _glued(text[cut - 1], text[cut]):
            return cut
    return want  # one unbreakable run longer than the bound: cut it anyway


def _closest(candidates: list[int], target: float) -> int | None:
    return min(candidates, key=lambda c: (abs(c - target), -c)) if candidates else None


def _next_start(text: str, max_chars: int) -> int:
    """Where the second piece of ``text`` (stripped, longer than ``max_chars``) begins."""
    length = len(text)
    pieces = math.ceil(length / max_chars)
    target = length / pieces
    shortest = length - (pieces - 1) * max_chars  # any shorter and one more piece is needed
    window = text[: max_chars + 1]
    lowest_clause = max(shortest, target * _CLAUSE_SLACK)
    clause_ends = [m.end() for m in CLAUSE_MARK.finditer(window) if lowest_clause <= m.end() <= max_chars]
    spaces = [i for i, char in enumerate(window) if char == " " and i > 0]
    end = _closest(clause_ends, target)
    if end is None:
        end = _closest([i for i in spaces if i >= shortest], target)
    if end is None and spaces:
        end = spaces[-1]  # the balanced range has no space: take the last one that fits
    if end is None:
        end = _hard_cut(text, min(max_chars, math.ceil(target)))
    while text[end].isspace():  # a stripped text never ends in whitespace
        end += 1
    return end


def split_long_sentence(sentence: str, max_chars: int) -> list[str]:
    """Pieces of at most ``max_chars`` characters (not counting the whitespace that ends them).

    Each piece keeps the whitespace that followed it, so ``"".join(pieces)`` equals ``sentence``
    except for leading whitespace.
    """
    pieces = []
    rest = sentence.lstrip()
    while len(rest.rstrip()) > max_chars:
        start = _next_start(rest.rstrip(), max_chars)
        pieces.append(rest[:start])
        rest = rest[start:]
    if rest.strip():
        pieces.append(rest)
    return pieces


def split_into_chunks(text: str, max_chars: int = DEFAULT_MAX_CHARS, language: str | None = None) -> list[str]:
    """Cut ``text`` into sentence-aligned chunks of at most ``max_chars`` characters.

    ``language`` is a Chatterbox language code for sentence segmentation (``None``: English).
    Chunks are stripped and have single spaces; an empty or whitespace-only text gives ``[]``.
    Raises ``TypeError`` for a non-string text, ``ValueError`` for a bad ``max_chars`` and
    ``UnsupportedLanguageError`` for an unknown language.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < MIN_MAX_CHARS:
        raise ValueError(f"max_chars must be an integer of at least {MIN_MAX_CHARS}, got {max_chars!r}")
    language = sentence_language(language)
    chunks: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        pieces = [piece for sentence in split_sentences(paragraph, language)
                  for piece in split_long_sentence(sentence, max_chars)]
        chunks += _pack(pieces, _balanced_bound(pieces, max_chars))
    return chunks


def _pack(pieces: list[str], bound: int) -> list[str]:
    """Consecutive pieces, greedily, into chunks of at most ``bound`` characters (stripped)."""
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len((current + piece).rstrip()) > bound:
            chunks.append(current.strip())
            current = ""
        current += piece
    if current.strip():
        chunks.append(current.strip())
    return chunks


def _balanced_bound(pieces: list[str], max_chars: int) -> int:
    """The smallest bound that packs ``pieces`` into as few chunks as ``max_chars`` does. Greedy
    packing gives the fewest chunks for any bound, and that count only falls as the bound
    grows, so a binary search finds it."""
    fewest = len(_pack(pieces, max_chars))
    low = max((len(p.strip()) for p in pieces), default=1)
    high = max_chars
    while low < high:
        middle = (low + high) // 2
        if len(_pack(pieces, middle)) <= fewest:
            high = middle
        else:
            low = middle + 1
    return high
