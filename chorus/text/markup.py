"""Pauses and an SSML subset in the input text: parsed and checked once, for every door.

``parse_markup(text, input_format)`` turns a request's input into :class:`Markup`: the text to
speak, cut into :class:`Segment` objects at each pause, and (SSML only) the speed that a
``prosody rate`` asks for. Two input formats (docs/pauses.md):

* ``"text"`` (the default): plain text in which only ``<break time="500ms"/>`` is special (the
  ElevenLabs convention; ``ms`` or ``s``, quotes ``"`` or ``'``, case-insensitive). Any other
  ``<`` stays text. A malformed break tag is an error naming the problem and its position.
* ``"ssml"``: an XML document of the subset ``speak`` (root), ``p``, ``s``, ``break`` (``time``
  or ``strength``) and ``prosody`` (``rate`` only, around the whole text: the speed is per
  request). Anything else is an error naming the element (or attribute) and its position. A
  document type declaration is refused before its entities are read.

Positions are ``line L, column C``, both counted from 1 (a column counts characters). Bounds:
``MAX_BREAK_S`` per break, ``MAX_TOTAL_BREAK_S`` per request. Errors are
:class:`MarkupError`, a ``TextInputError``.
"""
from __future__ import annotations

import re
import xml.parsers.expat
from dataclasses import dataclass

from chorus.text.errors import TextInputError

INPUT_FORMATS = ("text", "ssml")
MAX_BREAK_S = 10.0  # one break
MAX_TOTAL_BREAK_S = 30.0  # all breaks of one request
# SSML's break strengths and prosody rates (SSML names them; the values are Chorus's choice)
BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0, "x-strong": 1.25}
DEFAULT_BREAK_STRENGTH = "medium"  # a <break/> without attributes, as SSML says
PROSODY_RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "fast": 1.5, "x-fast": 2.0}
SSML_ELEMENTS = ("speak", "p", "s", "break", "prosody")
_ATTRIBUTES = {"speak": ("version", "xmlns", "xml:lang"), "p": (), "s": (), "break": ("time", "strength"),
               "prosody": ("rate",)}

_BREAK_OPEN = re.compile(r"<break(?=[\s/>]|$)", re.IGNORECASE)
_ATTRIBUTE = re.compile(r"\s+([A-Za-z_:][\w:.-]*)\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")
_TAG_END = re.compile(r"\s*/?>")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s)", re.IGNORECASE)
_PERCENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)%")


class MarkupError(TextInputError):
    """A break tag or SSML element that is malformed or outside the supported subset. ``line``
    and ``column`` (from 1) locate it; ``element`` names it where there is one."""

    def __init__(self, problem: str, line: int, column: int, element: str | None = None):
        super().__init__(f"{problem} (at line {line}, column {column})")
        self.problem, self.line, self.column, self.element = problem, line, column, element


@dataclass(frozen=True)
class Segment:
    """Text to speak after a pause of ``pause_before_s`` seconds (0: none). Blank lines in
    ``text`` end a paragraph (a chunk never spans two)."""

    text: str
    pause_before_s: float = 0.0


@dataclass(frozen=True)
class Markup:
    """A parsed input: its segments in order (none but whitespace-only text is dropped; pauses
    that meet add up), the pause after the last one, and the speed an SSML ``prosody rate`` set
    (None: not given)."""

    segments: tuple[Segment, ...]
    pause_after_s: float = 0.0
    speed: float | None = None

    @property
    def total_pause_s(self) -> float:
        return sum(s.pause_before_s for s in self.segments) + self.pause_after_s


def parse_markup(text: str, input_format: str = "text", *,
                 speed_range: tuple[float, float] = (0.25, 4.0)) -> Markup:
    """Parse ``text`` as ``input_format`` (one of ``INPUT_FORMATS``). ``speed_range``: the speeds
    a ``prosody rate`` may map to (the caller's speed bounds). Raises :class:`MarkupError`."""
    if not isinstance(text, str):
        raise TextInputError(f"text must be a str, got {type(text).__name__}")
    if input_format == "text":
        return _parse_text(text)
    if input_format == "ssml":
        return _SsmlParser(text, speed_range).parse()
    raise TextInputError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")


def line_column(text: str, offset: int) -> tuple[int, int]:
    """The line and column (both from 1) of ``text[offset]``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _Builder:
    """Collects text and pauses into segments, checking the bounds of each pause."""

    def __init__(self):
        self.segments: list[Segment] = []
        self.parts: list[str] = []
        self.pause = 0.0  # pending: before the next segment
        self.total = 0.0

    def add_text(self, text: str) -> None:
        self.parts.append(text)

    def add_pause(self, seconds: float, where: tuple[int, int], element: str = "break") -> None:
        if seconds > MAX_BREAK_S:
            raise MarkupError(f"a break lasts at most {MAX_BREAK_S:g} s, got {seconds:g} s", *where, element)
        self.total += seconds
        if self.total > MAX_TOTAL_BREAK_S + 1e-9:
            raise MarkupError(f"the breaks of one request add up to at most {MAX_TOTAL_BREAK_S:g} s; this one "
                              f"brings them to {self.total:g} s", *where, element)
        self.end_segment()
        self.pause += seconds

    def end_segment(self) -> None:
        text = "".join(self.parts)
        self.parts = []
        if text.strip():
            self.segments.append(Segment(text.strip(), self.pause))
            self.pause = 0.0

    def markup(self, speed: float | None = None) -> Markup:
        self.end_segment()
        return Markup(tuple(self.segments), self.pause, speed)


def _duration(value: str, where: tuple[int, int], element: str = "break") -> float:
    """Seconds of a break's ``time`` ("500ms", "1.5s")."""
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        problem = "must not be negative" if value.strip().startswith("-") else \
            "must be a number of milliseconds or seconds such as \"500ms\" or \"1.5s\""
        raise MarkupError(f"break time {value!r} {problem}", *where, element)
    number, unit = float(match.group(1)), match.group(2).lower()
    return number / 1000.0 if unit == "ms" else number


def _parse_text(text: str) -> Markup:
    builder = _Builder()
    at = 0
    for match in _BREAK_OPEN.finditer(text):
        if match.start() < at:
            continue
        where = line_column(text, match.start())
        builder.add_text(text[at:match.start()])
        attributes: dict[str, str] = {}
        pos = match.end()
        while (attribute := _ATTRIBUTE.match(text, pos)) is not None:
            name = attribute.group(1).lower()
            if name != "time":
                raise MarkupError(f"<break> takes only a time attribute, got {attribute.group(1)!r}", *where, "break")
            attributes[name] = attribute.group(2) if attribute.group(2) is not None else attribute.group(3)
            pos = attribute.end()
        end = _TAG_END.match(text, pos)
        if end is None:
            raise MarkupError("malformed <break> tag: write it as <break time=\"500ms\" /> (attribute values in "
                              "quotes, the tag closed with />)", *where, "break")
        if "time" not in attributes:
            raise MarkupError("<break> needs a time, such as <break time=\"500ms\" />", *where, "break")
        builder.add_pause(_duration(attributes["time"], where), where)
        at = end.end()
    builder.add_text(text[at:])
    return builder.markup()


class _SsmlParser:
    """The SSML subset, read with expat (the standard library's XML parser) so that every
    element's position is known; a DOCTYPE (and so any entity it could declare) is refused."""

    def __init__(self, text: str, speed_range: tuple[float, float]):
        self.text, self.speed_range = text, speed_range
        self.builder = _Builder()
        self.stack: list[str] = []
        self.prosody: tuple[float, tuple[int, int]] | None = None  # its rate and position
        self.prosody_depth: int | None = None
        self.text_outside_prosody = False
        self.parser = xml.parsers.expat.ParserCreate()
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._characters
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.ProcessingInstructionHandler = self._instruction

    def parse(self) -> Markup:
        try:
            self.parser.Parse(self.text, True)
        except xml.parsers.expat.ExpatError as exc:
            problem = xml.parsers.expat.errors.messages[exc.code] if exc.code else str(exc)
            raise MarkupError(f"the SSML is not well-formed XML: {problem}", exc.lineno, exc.offset + 1) from None
        speed = None
        if self.prosody is not None:
            speed, where = self.prosody
            if self.text_outside_prosody:
                raise MarkupError("<prosody rate> sets the speed of the whole request, so it must enclose all of the "
                                  "text (the speed cannot change within a request)", *where, "prosody")
        return self.builder.markup(speed)

    def _where(self) -> tuple[int, int]:
        return self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1

    def _doctype(self, name, *_):
        raise MarkupError("the SSML must not contain a document type declaration (<!DOCTYPE>)", *self._where())

    def _instruction(self, target, _data):
        raise MarkupError(f"the SSML must not contain processing instructions (<?{target} ...?>)", *self._where())

    def _start(self, name: str, attributes: dict[str, str]) -> None:
        where = self._where()
        if name not in _ATTRIBUTES:
            raise MarkupError(f"<{name}> is not supported; the SSML subset is {', '.join(SSML_ELEMENTS)}",
                              *where, name)
        if not self.stack and name != "speak":
            raise MarkupError(f"the SSML root must be <speak>, got <{name}>", *where, name)
        if self.stack and name == "speak":
            raise MarkupError("<speak> may only be the root", *where, name)
        if self.stack and self.stack[-1] == "break":
            raise MarkupError(f"<break> must be empty, got <{name}> inside it", *where, name)
        for attribute in attributes:
            if attribute not in _ATTRIBUTES[name]:
                allowed = ", ".join(_ATTRIBUTES[name]) or "none"
                raise MarkupError(f"<{name}> does not take the attribute {attribute!r} (supported: {allowed})",
                                  *where, name)
        self.stack.append(name)
        if name in ("p", "s"):
            self.builder.add_text("\n\n")
        elif name == "break":
            self.builder.add_pause(self._break_seconds(attributes, where), where)
        elif name == "prosody":
            self._start_prosody(attributes, where)

    def _end(self, name: str) -> None:
        self.stack.pop()
        if name in ("p", "s"):
            self.builder.add_text("\n\n")
        if name == "prosody":
            self.prosody_depth = None

    def _characters(self, data: str) -> None:
        if self.stack and self.stack[-1] == "break" and data.strip():
            raise MarkupError("<break> must be empty", *self._where(), "break")
        if data.strip() and self.prosody_depth is None:
            self.text_outside_prosody = True
        self.builder.add_text(data)

    def _break_seconds(self, attributes: dict[str, str], where: tuple[int, int]) -> float:
        if "time" in attributes and "strength" in attributes:
            raise MarkupError("<break> takes time or strength, not both", *where, "break")
        if "time" in attributes:
            return _duration(attributes["time"], where)
        strength = attributes.get("strength", DEFAULT_BREAK_STRENGTH)
        if strength not in BREAK_STRENGTHS:
            raise MarkupError(f"break strength {strength!r} is not one of {', '.join(BREAK_STRENGTHS)}",
                              *where, "break")
        return BREAK_STRENGTHS[strength]

    def _start_prosody(self, attributes: dict[str, str], where: tuple[int, int]) -> None:
        if self.prosody is not None:
            raise MarkupError("only one <prosody> is supported (it sets the speed of the whole request)",
                              *where, "prosody")
        if "rate" not in attributes:
            raise MarkupError("<prosody> needs a rate, such as rate=\"80%\" or rate=\"slow\"", *where, "prosody")
        rate = attributes["rate"].strip()
        percent = _PERCENT.fullmatch(rate)
        if rate in PROSODY_RATES:
            speed = PROSODY_RATES[rate]
        elif percent is not None:
            speed = float(percent.group(1)) / 100.0
        else:
            raise MarkupError(f"prosody rate {rate!r} must be a percentage such as \"80%\" or one of "
                              f"{', '.join(PROSODY_RATES)}", *where, "prosody")
        low, high = self.speed_range
        if not low <= speed <= high:
            raise MarkupError(f"prosody rate {rate!r} is a speed of {speed:g}; speed must be between {low:g} and "
                              f"{high:g}", *where, "prosody")
        self.prosody = (speed, where)
        self.prosody_depth = len(self.stack)
