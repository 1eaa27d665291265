"""The text threshold of the voice-agent WebSocket: text deltas of one turn in, pieces to speak out.

An agent's LLM sends its reply a token at a time; each piece cut here becomes one pipeline
request. A piece is cut from the front of the turn's buffer (docs/voice-agents.md):

1. at the last **sentence end** that leaves a piece of at least ``min_chars`` (sentence ends are
   :func:`chorus.text.sentences.split_sentences`'s inner boundaries, so an end must be followed
   by the next sentence's first character: ``"3.5"``, ``"Mr. Smith"`` and an unfinished ``"Hello."``
   do not cut; a line break counts as a sentence end);
2. else at the last **clause mark** (``, ; :`` and dashes followed by whitespace, CJK ``，、；：``:
   :data:`chorus.text.chunking.CLAUSE_MARK`) that leaves a piece of at least ``clause_chars``
   (half of ``max_chars``: a long sentence is split where a speaker would pause, before it would
   be cut at a plain space);
3. else, once the buffer holds ``max_chars``, at the last **word break** within ``max_chars``;
4. else, once the oldest buffered character has waited ``max_wait_ms``, at the last word break.

Every cut leaves a piece of at most ``max_chars`` characters (a single word longer than that is
cut inside) holding at least two words, so a one-word fragment is never spoken unless the turn is
flushed. A word break is whitespace after a word, or a point between two characters of a
script written without spaces (CJK, Thai). :meth:`TextPieces.flush` cuts the rest by the same
rules and speaks what remains whatever its size; a remainder without a letter or digit is not
spoken. Pieces carry their offsets into the turn's whole text (Python ``str`` indices).
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

from chorus.text.chunking import CLAUSE_MARK, is_scriptio_continua
from chorus.text.sentences import split_sentences

# Defaults (docs/voice-agents.md, "Text threshold"): first audio waits for min_chars of text, so it
# is small: 20 characters arrive in 0.1-0.25 s from an LLM at 20-50 tokens/s (~4 characters per
# token) and hold a short opening sentence ("Sure, I can do that."), which T3 speaks with a
# sentence's intonation. 160 characters (~10 s of speech) keep a piece inside one T3 chunk of the
# pipeline (max_chars 225-300), so a piece is one T3 row. 500 ms only passes without a cut when the
# LLM produces text slower than ~40 characters/s, near the speech rate (~15 characters/s): then
# waiting longer starves the listener, so two words are spoken as they are.
DEFAULT_MIN_CHARS = 20
DEFAULT_MAX_CHARS = 160
DEFAULT_MAX_WAIT_MS = 500
MAX_WAIT_LIMIT_MS = 60_000
MIN_PIECE_WORDS = 2


@dataclass(frozen=True)
class Chunking:
    """The text threshold's sizes (a connection's ``chunking``; the server's defaults)."""

    min_chars: int = DEFAULT_MIN_CHARS
    max_chars: int = DEFAULT_MAX_CHARS
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS

    def __post_init__(self):
        for name in ("min_chars", "max_chars", "max_wait_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"chunking.{name} must be an integer, got {value!r}")
        if not 1 <= self.min_chars <= self.max_chars:
            raise ValueError(f"chunking.min_chars must be in 1..max_chars ({self.max_chars}), got {self.min_chars}")
        if self.max_chars < 2:
            raise ValueError(f"chunking.max_chars must be at least 2, got {self.max_chars}")
        if not 0 <= self.max_wait_ms <= MAX_WAIT_LIMIT_MS:
            raise ValueError(f"chunking.max_wait_ms must be in 0..{MAX_WAIT_LIMIT_MS}, got {self.max_wait_ms}")

    @property
    def clause_chars(self) -> int:
        """The shortest piece cut at a clause mark."""
        return max(self.min_chars, self.max_chars // 2)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Piece:
    """A cut piece: its text (``whole_text[start:end]``, no surrounding whitespace) and how long
    its first character waited in the buffer."""

    text: str
    start: int
    end: int
    waited_s: float


class TextPieces:
    """One turn's buffer: :meth:`push` deltas, :meth:`poll` when :meth:`deadline` passes,
    :meth:`flush` at the end. Times are the caller's clock in seconds. Not thread-safe."""

    def __init__(self, chunking: Chunking, language: str | None = None):
        self.chunking = chunking
        self.language = language
        self._buffer = ""  # text not yet cut; never starts with whitespace
        self._base = 0  # offset of the buffer's first character in the turn's text
        self._arrivals: deque[tuple[int, float]] = deque()  # (offset of a delta's first character, time)
        self.received = 0  # characters of the turn so far

    @property
    def buffered(self) -> int:
        """Characters received and not yet cut into a piece."""
        return len(self._buffer)

    def push(self, text: str, now: float) -> list[Piece]:
        """Add a delta; the pieces it completes."""
        if text:
            self._arrivals.append((self.received, now))
            self.received += len(text)
            self._buffer += text
            self._skip_space()
        return self._cut(now, flushed=False)

    def poll(self, now: float) -> list[Piece]:
        """The pieces the time threshold cuts by ``now``."""
        return self._cut(now, flushed=False)

    def flush(self, now: float) -> list[Piece]:
        """Everything buffered, as pieces."""
        return self._cut(now, flushed=True)

    def deadline(self) -> float | None:
        """When the oldest buffered character has waited ``max_wait_ms`` (None: nothing buffered)."""
        if not self._buffer:
            return None
        return self._oldest() + self.chunking.max_wait_ms / 1000

    # -- cutting -------------------------------------------------------------------------------
    def _oldest(self) -> float:
        assert self._arrivals and self._arrivals[0][0] <= self._base, (self._arrivals, self._base)
        return self._arrivals[0][1]

    def _skip_space(self) -> None:
        stripped = self._buffer.lstrip()
        self._base += len(self._buffer) - len(stripped)
        self._buffer = stripped
        while len(self._arrivals) > 1 and self._arrivals[1][0] <= self._base:
            self._arrivals.popleft()
        if not self._buffer:
            self._arrivals.clear()

    def _cut(self, now: float, flushed: bool) -> list[Piece]:
        pieces = []
        while self._buffer:
            cut = self._next_cut(now, flushed)
            if cut is None:
                break
            piece = self._take(cut, now)
            if piece is not None:
                pieces.append(piece)
        return pieces

    def _take(self, cut: int, now: float) -> Piece | None:
        waited = now - self._oldest()
        raw = self._buffer[:cut]
        text = raw.rstrip()
        start = self._base
        self._buffer = self._buffer[cut:]
        self._base += cut
        self._skip_space()
        if not any(c.isalnum() for c in text):
            return None  # punctuation or symbols alone: nothing to speak
        return Piece(text, start, start + len(text), waited)

    def _next_cut(self, now: float, flushed: bool) -> int | None:
        """Where the next piece ends in the buffer, or None to wait for more text."""
        b, c = self._buffer, self.chunking
        if flushed and len(b.rstrip()) <= c.max_chars:
            return len(b)
        window = b[: 2 * c.max_chars]  # no cut lies further: a piece holds at most max_chars
        if len(b) >= c.min_chars:
            cut = self._last(_sentence_ends(window, self.language), c.min_chars)
            if cut is None and len(b) >= c.clause_chars:
                cut = self._last([m.end() for m in CLAUSE_MARK.finditer(window)], c.clause_chars)
            if cut is not None:
                return cut
        if flushed or len(b) >= c.max_chars:
            cut = self._last(_word_breaks(window), 1)
            return cut if cut is not None else _hard_cut(b, c.max_chars)
        if now >= self.deadline():  # the very arithmetic the turn's timer is armed with
            return self._last(_word_breaks(window), 1)
        return None

    def _last(self, positions: list[int], least: int) -> int | None:
        """The last of ``positions`` (ascending) whose piece holds ``least`` to ``max_chars``
        characters and at least two words."""
        for p in reversed(positions):
            if _inside_break_tag(self._buffer, p):
                continue  # a pause tag is parsed whole (chorus.text.markup): never cut inside one
            size = len(self._buffer[:p].rstrip())
            if size < least:
                return None
            if size <= self.chunking.max_chars and _words(self._buffer[:p]) >= MIN_PIECE_WORDS:
                return p
        return None


MAX_TAG_CHARS = 64  # longer than any `<break time="..."/>`: past it an open '<' is plain text


def _inside_break_tag(text: str, offset: int) -> bool:
    """Whether ``offset`` lies inside a ``<break .../>`` tag, or what may still become one (an
    unclosed ``<`` whose name so far is a prefix of ``break``, within MAX_TAG_CHARS)."""
    start = text.rfind("<", max(0, offset - MAX_TAG_CHARS), offset)
    if start < 0 or ">" in text[start:offset]:
        return False
    name = text[start + 1:offset].lstrip().split(None, 1)
    head = name[0].lower() if name else ""
    return "break".startswith(head) or head.startswith("break")


def _sentence_ends(text: str, language: str | None) -> list[int]:
    """Offsets just past each sentence that another sentence follows, and past each line break."""
    ends, offset = [], 0
    for line in text.splitlines(keepends=True):
        sentences = split_sentences(line, language)
        for sentence in sentences[:-1]:
            offset += len(sentence)
            ends.append(offset)
        offset += len(sentences[-1])
        if line.splitlines()[0] != line:  # the line ends with its break
            ends.append(offset)
    return ends


def _word_breaks(text: str) -> list[int]:
    """Offsets where a word has ended: a whitespace character after a non-space one, and points
    between two characters of a script written without spaces (the last character is not known
    to end a word until something follows it)."""
    breaks = []
    for i in range(1, len(text)):
        left, right = text[i - 1], text[i]
        if right.isspace() and not left.isspace():
            breaks.append(i)
        elif (is_scriptio_continua(left) or is_scriptio_continua(right)) and not left.isspace() \
                and not right.isspace() and not _combining(right):
            breaks.append(i)
    return breaks


def _combining(char: str) -> bool:
    import unicodedata

    return unicodedata.category(char)[0] == "M"


def _hard_cut(text: str, size: int) -> int:
    """A cut inside one run longer than ``size`` (no word break in it)."""
    return max(1, min(size, len(text)))


def _words(text: str) -> int:
    """Words in ``text``: whitespace-separated tokens with a letter or digit, each character of a
    script written without spaces counting as one."""
    count = 0
    for token in text.split():
        continua = sum(1 for ch in token if is_scriptio_continua(ch) and ch.isalnum())
        count += continua if continua else int(any(ch.isalnum() for ch in token))
    return count
