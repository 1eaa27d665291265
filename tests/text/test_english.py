"""English normalisation for speech: one rule per test, idempotence, other languages untouched."""
from __future__ import annotations

import random

import pytest

from chorus.text import normalize_for_speech
from chorus.text.english import MAX_CARDINAL_DIGITS, is_english
from chorus.text.sample_text import SAMPLE_SENTENCES
from tests.text.corpus import EDGE_CASES

RULES = {
    "integer": ("I have 42 cats.", "I have forty-two cats."),
    "thousands separator": ("1,234 people", "one thousand two hundred and thirty-four people"),
    "decimal": ("Pi is 3.14.", "Pi is three point one four."),
    "negative": ("It was -5 degrees.", "It was minus five degrees."),
    "ordinal": ("the 1st and 22nd", "the first and twenty-second"),
    "year": ("Born in 1999.", "Born in nineteen ninety-nine."),
    "recent year": ("In 2024 it rained.", "In twenty twenty-four it rained."),
    "decade": ("the 1990s", "the nineteen nineties"),
    "short decade": ("the '80s", "the eighties"),
    "dollars and cents": ("$5.50", "five dollars and fifty cents"),
    "one dollar": ("$1", "one dollar"),
    "cents only": ("€0.99", "ninety-nine cents"),
    "pounds": ("£3", "three pounds"),
    "currency scale": ("$3.5 million", "three point five million dollars"),
    "percentage": ("50% off", "fifty percent off"),
    "range": ("pages 10-20", "pages ten to twenty"),
    "year range": ("1990–1995", "nineteen ninety to nineteen ninety-five"),
    "phone number": ("Call 555-1234.", "Call five five five, one two three four."),
    "time": ("at 3:30 pm", "at three thirty P M"),
    "time with oh": ("at 10:05", "at ten oh five"),
    "hour with meridiem": ("at 5 p.m. today", "at five P M today"),
    "date": ("on Jan. 3", "on January third"),
    "ampersand": ("Tom & Jerry", "Tom and Jerry"),
    "ampersand in a word": ("R&D", "R and D"),
    "mister": ("Mr. Jones", "Mister Jones"),
    "missus and miz": ("Mrs. and Ms. White", "Missus and Miz White"),
    "doctor": ("ask Dr. Smith", "ask Doctor Smith"),
    "saint": ("in St. Louis", "in Saint Louis"),
    "street": ("on Main St. today", "on Main Street today"),
    "number": ("No. 5", "Number five"),
    "versus": ("cats vs. dogs", "cats versus dogs"),
    "for example": ("fruit, e.g. apples", "fruit, for example apples"),
    "that is": ("soon, i.e. now", "soon, that is now"),
    "et cetera": ("pears, etc. and more", "pears, et cetera and more"),
}

UNCHANGED = {
    "number glued to letters": "Q3 sales, 5km, mp3",
    "dotted version": "version 2.0.1",
    "drive after a street name": "Mulholland Dr. Later",
    "lone saint abbreviation": "the st. was closed",
    "other scripts' digits": "١٢٣ ３",
    "emoji and control characters": "Hi 😀👍🏽 \x00\x1f\x7f end",
}

ODD_INPUTS = ("", " ", "\x00", "😀" * 50, "9" * 10_000, "$" * 100, "&&&", "1," * 500, "St. " * 50,
              "\ud800", "-" * 40 + "5", ".5", "5.", "0", "%%%", "::30", "Dr." * 20)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule(rule):
    text, expected = RULES[rule]
    assert normalize_for_speech(text, "en") == expected


@pytest.mark.parametrize("case", sorted(UNCHANGED))
def test_left_alone(case):
    assert normalize_for_speech(UNCHANGED[case], "en") == UNCHANGED[case]


def test_abbreviation_full_stop_that_ends_a_sentence_is_kept():
    assert normalize_for_speech("Apples, pears, etc. Then more.", "en") == "Apples, pears, et cetera. Then more."


def test_the_brief_example_sentence():
    assert normalize_for_speech("Dr. Smith met Mr. Jones at 5 p.m. on Jan. 3.", "en") == (
        "Doctor Smith met Mister Jones at five P M on January third."
    )


def test_leading_zero_is_read_digit_by_digit():
    assert normalize_for_speech("Agent 007", "en") == "Agent zero zero seven"


def test_very_long_integer_is_read_digit_by_digit():
    digits = "12" * MAX_CARDINAL_DIGITS
    assert normalize_for_speech(digits, "en") == " ".join(["one", "two"] * MAX_CARDINAL_DIGITS)


def test_cardinals_carry_no_commas():
    assert "," not in normalize_for_speech("1234567", "en")


def test_none_counts_as_english():
    assert normalize_for_speech("I have 2 cats.", None) == "I have two cats."


@pytest.mark.parametrize("code", ["EN", "en-GB", "en_us", " en "])
def test_regional_english_codes_count_as_english(code):
    assert is_english(code)


@pytest.mark.parametrize("language", ["fr", "de", "zh", "ja", "ar", "ru", "hi", "eng", "es"])
def test_other_languages_are_untouched(language):
    text = "Dr. Martin a 3 chats & 1,5 chien à 10:30 — $5."
    assert normalize_for_speech(text, language) is text


@pytest.mark.parametrize("text", ODD_INPUTS, ids=range(len(ODD_INPUTS)))
def test_odd_input_does_not_raise(text):
    assert isinstance(normalize_for_speech(text, "en"), str)


IDEMPOTENCE_TEXTS = (tuple(text for text, _ in RULES.values()) + tuple(UNCHANGED.values()) + ODD_INPUTS
                     + EDGE_CASES + (SAMPLE_SENTENCES["en"],))


@pytest.mark.parametrize("text", IDEMPOTENCE_TEXTS, ids=range(len(IDEMPOTENCE_TEXTS)))
def test_normalising_twice_changes_nothing(text):
    once = normalize_for_speech(text, "en")
    assert normalize_for_speech(once, "en") == once


def test_normalising_twice_changes_nothing_on_a_random_corpus():
    rng = random.Random(11)
    pieces = ("1", "22", "1999", "007", "3.14", "1,234", "-5", "$", "£", "%", "&", ":", "30", "pm", "p.m.", "st",
              "nd", "s", "'", "-", "–", "Dr.", "Mr.", "St.", "No.", "vs.", "etc.", "e.g.", "Jan.", "May", "Main",
              " ", ".", ",", "😀", "\x00", "\n", "Q", "555-1234")
    for _ in range(2000):
        text = "".join(rng.choice(pieces) + rng.choice(("", " ")) for _ in range(rng.randint(0, 12)))
        once = normalize_for_speech(text, None)
        assert normalize_for_speech(once, None) == once, text


def test_non_string_text_is_rejected():
    with pytest.raises(TypeError):
        normalize_for_speech(42, "en")


def test_non_string_language_is_rejected():
    with pytest.raises(TypeError):
        normalize_for_speech("Hi", 1)
