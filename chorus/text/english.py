"""English normalisation for speech: numbers, symbols and abbreviations the model would misread.

Chatterbox tokenizes raw graphemes, so "$5.50", "1999" or "Dr." reach T3 as digits and symbols it
reads unreliably. :func:`normalize_for_speech` rewrites them as words, English only, before the
text is chunked and tokenized. It is a deliberate deviation from the reference (which speaks the
raw text); the pipeline applies it by default and lets a request turn it off.

What is rewritten (in this order):

* ``&`` -> "and";
* titles: ``Mr. Mrs. Ms.`` always; ``Dr. Prof. Rev. Sgt. Capt. Lt.`` before a capitalised name;
  ``St.`` -> "Saint" before a name, "Street" after one; ``No.`` before a number -> "number";
  ``vs.`` ``etc.`` ``e.g.`` ``i.e.``; month abbreviations before a day (``Jan. 3``);
* dates "January 3" / "3rd" -> ordinals; clock times "3:30 pm", "5 p.m."; decades "1990s", "'80s";
* currency ``$ £ € ¥`` with cents/pence and an optional scale word ("$3.5 million");
* phone-like groups "555-1234" digit by digit; ranges "10-20" / "1990–1995" -> "to";
* ordinals "22nd"; percentages "50%"; negative numbers; thousands separators "1,234"; decimals
  "3.14" -> "three point one four"; a four-digit integer 1100-2099 as a year ("nineteen
  ninety-nine"); other integers as cardinals.

What is left alone: numbers glued to letters ("Q3", "5km", "mp3"), dotted groups ("2.0.1",
IP addresses), anything ambiguous (``Dr.`` after a street name, a lone ``St.``). Integers with a
leading zero ("007") or more than :data:`MAX_CARDINAL_DIGITS` digits are read digit by digit.
The result contains no rewritable pattern, so normalising twice changes nothing.
"""
from __future__ import annotations

import re
from typing import Callable

from num2words import num2words

# Longer integers (card numbers, ids, absurd values) are read digit by digit.
MAX_CARDINAL_DIGITS = 15

_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_MONTH_ABBREVIATIONS = {m[:3]: m for m in _MONTHS if m != "May"} | {"Sept": "September"}
_CURRENCIES = {  # symbol: (unit, units, minor unit, minor units)
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "", ""),
}
_NUMBER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)"  # an integer, with or without thousands separators
_NOT_AFTER = r"(?<![\w.,\-\u2212])"  # a number does not continue a word, a decimal or a range


def _words(text: str) -> str:
    return text.replace(",", "")  # num2words' commas would become pauses


def digits_aloud(digits: str) -> str:
    """"0123" -> "zero one two three"."""
    return " ".join(_DIGIT_WORDS[int(d)] for d in digits if d in "0123456789")


def cardinal(digits: str) -> str:
    """Words of a non-negative integer written with digits and optional thousands commas."""
    plain = digits.replace(",", "")
    if (len(plain) > 1 and plain.startswith("0")) or len(plain) > MAX_CARDINAL_DIGITS:
        return digits_aloud(plain)
    return _words(num2words(int(plain)))


def _looks_like_year(digits: str) -> bool:
    return len(digits) == 4 and 1100 <= int(digits) <= 2099


def _number(digits: str, fraction: str | None = None, year_ok: bool = False) -> str:
    if fraction:
        return f"{cardinal(digits)} point {digits_aloud(fraction)}"
    if year_ok and _looks_like_year(digits):
        return _words(num2words(int(digits), to="year"))
    return cardinal(digits)


def _ordinal(digits: str) -> str:
    plain = digits.replace(",", "")
    if len(plain) > MAX_CARDINAL_DIGITS:
        return digits_aloud(plain)
    return _words(num2words(int(plain), to="ordinal"))


def _plural(words: str) -> str:
    """"nineteen ninety" -> "nineteen nineties"."""
    head, _, last = words.rpartition(" ")
    last = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return f"{head} {last}".strip()


_SENTENCE_ENDS_AFTER = re.compile(r"\s*$|\s+[\"'\u201c(]?[A-Z]")


def _sentence_stop(text: str, end: int) -> str:
    """"." when the full stop of an abbreviation ending at ``end`` also ends the sentence."""
    return "." if _SENTENCE_ENDS_AFTER.match(text, end) else ""


def _capitalised_like(word: str, source: str) -> str:
    return word[:1].upper() + word[1:] if source[:1].isupper() else word


# --- rules: each takes the text and returns it rewritten -------------------------------------

def _ampersands(text: str) -> str:
    text = re.sub(r"(?<=\S)[ \t]*&[ \t]*(?=\S)", " and ", text)
    return re.sub(r"&", "and", text)


_TITLES_ALWAYS = {"Mr": "Mister", "Mrs": "Missus", "Ms": "Miz"}
_TITLES_BEFORE_NAME = {"Dr": "Doctor", "Prof": "Professor", "Rev": "Reverend", "Sgt": "Sergeant",
                       "Capt": "Captain", "Lt": "Lieutenant"}
_CAPITALISED_WORD_BEFORE = re.compile(r"[A-Z][\w'-]*\s+$")


def _after_capitalised_word(m: re.Match) -> bool:
    return _CAPITALISED_WORD_BEFORE.search(m.string[max(0, m.start() - 64): m.start()]) is not None


def _titles(text: str) -> str:
    text = re.sub(r"\b(Mr|Mrs|Ms)\.", lambda m: _TITLES_ALWAYS[m.group(1)], text)

    def before_name(m: re.Match) -> str:
        if m.group(1) == "Dr" and _after_capitalised_word(m):
            return m.group()  # "Mulholland Dr. Later" is a street
        return _TITLES_BEFORE_NAME[m.group(1)]

    text = re.sub(r"\b(Dr|Prof|Rev|Sgt|Capt|Lt)\.(?=\s+[A-Z])", before_name, text)

    def saint_or_street(m: re.Match) -> str:
        if _after_capitalised_word(m):
            return "Street" + _sentence_stop(m.string, m.end())
        if re.match(r"\s+[A-Z]", m.string[m.end():]):
            return "Saint"
        return m.group()

    return re.sub(r"\bSt\.", saint_or_street, text)


def _latin_abbreviations(text: str) -> str:
    text = re.sub(r"\b([Nn])o\.\s*(?=[0-9])", lambda m: _capitalised_like("number ", m.group(1)), text)
    text = re.sub(r"\b([Vv])s\b\.?", lambda m: _capitalised_like("versus", m.group(1)), text)
    text = re.sub(r"\b([Ee])\.g\.(?!\w)", lambda m: _capitalised_like("for example", m.group(1)), text)
    text = re.sub(r"\b([Ii])\.e\.(?!\w)", lambda m: _capitalised_like("that is", m.group(1)), text)
    return re.sub(r"\b([Ee])tc\.", lambda m: _capitalised_like("et cetera", m.group(1))
                  + _sentence_stop(m.string, m.end()), text)


def _dates(text: str) -> str:
    months = "|".join(_MONTH_ABBREVIATIONS)
    text = re.sub(rf"\b({months})\.(?=\s+[0-9]{{1,2}}\b)", lambda m: _MONTH_ABBREVIATIONS[m.group(1)], text)

    def day(m: re.Match) -> str:
        value = int(m.group(2))
        return f"{m.group(1)} {_ordinal(m.group(2))}" if 1 <= value <= 31 else m.group()

    return re.sub(rf"\b({'|'.join(_MONTHS)})\s+([0-9]{{1,2}})(?:st|nd|rd|th)?\b(?![:.,][0-9])", day, text)


_MERIDIEM = r"([AaPp])\.?\s?[Mm]\b\.?"


def _clock(hours: str, minutes: str | None, meridiem: str | None) -> str | None:
    h, m = int(hours), int(minutes or 0)
    if h > 24 or m > 59 or (meridiem and not 1 <= h <= 12):
        return None
    spoken = cardinal(str(h))
    if m:
        spoken += " " + (f"oh {cardinal(str(m))}" if m < 10 else cardinal(str(m)))
    elif not meridiem:
        spoken += " o'clock" if minutes else ""
    return spoken + (f" {meridiem.upper()} M" if meridiem else "")


def _times(text: str) -> str:
    def replace(m: re.Match) -> str:
        spoken = _clock(m.group(1), m.group(2), m.group(3))
        if spoken is None:
            return m.group()
        return spoken + (_sentence_stop(m.string, m.end()) if m.group().endswith(".") else "")

    text = re.sub(_NOT_AFTER + rf"([0-9]{{1,2}}):([0-9]{{2}})(?:\s?{_MERIDIEM})?(?![0-9:])", replace, text)
    return re.sub(_NOT_AFTER + rf"([0-9]{{1,2}})()\s?{_MERIDIEM}", replace, text)


def _decades(text: str) -> str:
    text = re.sub(_NOT_AFTER + r"([0-9]{3}0)s\b", lambda m: _plural(_number(m.group(1), year_ok=True)), text)
    return re.sub(r"(?<![\w.,])'?([1-9]0)s\b", lambda m: _plural(cardinal(m.group(1))), text)


def _currency(text: str) -> str:
    def replace(m: re.Match) -> str:
        unit, units, minor, minors = _CURRENCIES[m.group(1)]
        whole, fraction, scale = m.group(2), m.group(3), m.group(4)
        if scale:
            return f"{_number(whole, fraction)} {scale} {units}"
        if fraction and (len(fraction) > 2 or not minor):
            return f"{_number(whole, fraction)} {units}"
        amount = int(whole.replace(",", ""))
        cents = int(fraction.ljust(2, "0")) if fraction else 0
        spoken = f"{cardinal(whole)} {unit if amount == 1 else units}"
        if cents and amount == 0:
            return f"{cardinal(str(cents))} {minor if cents == 1 else minors}"
        if cents:
            spoken += f" and {cardinal(str(cents))} {minor if cents == 1 else minors}"
        return spoken

    symbols = re.escape("".join(_CURRENCIES))
    return re.sub(rf"([{symbols}])\s?({_NUMBER})(?:\.([0-9]+))?(?:\s(thousand|million|billion|trillion)\b)?"
                  r"(?![\w]|[.,][0-9])", replace, text)


def _phone_numbers(text: str) -> str:
    def replace(m: re.Match) -> str:
        return ", ".join(digits_aloud(group) for group in m.group().split("-"))

    return re.sub(_NOT_AFTER + r"(?:[0-9]{3}-)?[0-9]{3}-[0-9]{4}(?![\w-])", replace, text)


def _ranges(text: str) -> str:
    def replace(m: re.Match) -> str:
        first, second = m.group(1), m.group(2)
        if int(first) >= int(second):
            return m.group()
        years = _looks_like_year(first) and _looks_like_year(second)
        return f"{_number(first, year_ok=years)} to {_number(second, year_ok=years)}"

    return re.sub(_NOT_AFTER + r"([0-9]{1,4})\s?[-\u2013]\s?([0-9]{1,4})(?![\w\-\u2013]|[.,][0-9])", replace, text)


def _ordinals(text: str) -> str:
    return re.sub(_NOT_AFTER + rf"({_NUMBER})(?:st|nd|rd|th)\b", lambda m: _ordinal(m.group(1)), text)


def _numbers(text: str) -> str:
    def replace(m: re.Match) -> str:
        sign, whole, fraction, percent = m.groups()
        plain = not (sign or fraction or percent or "," in whole)
        spoken = _number(whole, fraction, year_ok=plain)
        return ("minus " if sign else "") + spoken + (" percent" if percent else "")

    return re.sub(r"(?:(?<![\w.,\-\u2212])([-\u2212])(?=[0-9])|(?<![\w.,]))"
                  rf"({_NUMBER})(?:\.([0-9]+))?(\s?%)?(?!\w|[.,][0-9])", replace, text)


_RULES: tuple[Callable[[str], str], ...] = (
    _ampersands, _titles, _latin_abbreviations, _dates, _times, _decades, _currency,
    _phone_numbers, _ranges, _ordinals, _numbers,
)


# Some rules look at their neighbours ("St." after a capitalised word is "Street"), which other
# rules may rewrite; running to a fixed point makes the result idempotent. Real text settles in
# one pass (the second only confirms it); every pass that changes something removes a digit,
# symbol or abbreviation, so the bound is never reached in practice.
_MAX_PASSES = 4


def _apply_rules(text: str) -> str:
    for rule in _RULES:
        text = rule(text)
    return text


def is_english(language: str | None) -> bool:
    """``None``, ``"en"`` and regional forms such as ``"en-GB"`` / ``"EN_us"`` count as English."""
    if language is None:
        return True
    code = language.strip().lower().replace("_", "-")
    return code == "en" or code.startswith("en-")


def normalize_for_speech(text: str, language: str | None) -> str:
    """Rewrite what an English speaker would say differently from what is written.

    For any language other than English (``None`` counts as English) ``text`` is returned
    unchanged. Never raises on odd characters; idempotent. Raises ``TypeError`` when ``text``
    is not a ``str`` or ``language`` is neither ``None`` nor a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if language is not None and not isinstance(language, str):
        raise TypeError(f"language must be a str or None, got {type(language).__name__}")
    if not is_english(language):
        return text
    for _ in range(_MAX_PASSES):
        rewritten = _apply_rules(text)
        if rewritten == text:
            break
        text = rewritten
    return text
