"""Break tags in plain text and the SSML subset: every accepted form, every rejection with its
message and position (docs/pauses.md)."""
from __future__ import annotations

import pytest

from chorus.text import TextInputError
from chorus.text.markup import (
    BREAK_STRENGTHS,
    MAX_BREAK_S,
    MAX_TOTAL_BREAK_S,
    PROSODY_RATES,
    Markup,
    MarkupError,
    Segment,
    parse_markup,
)


def _ssml(body: str) -> Markup:
    return parse_markup(f"<speak>{body}</speak>", "ssml")


def _error(text: str, input_format: str = "text") -> MarkupError:
    with pytest.raises(MarkupError) as caught:
        parse_markup(text, input_format)
    return caught.value


# ------------------------------------------------------------------------------- plain text
def test_text_without_breaks_is_one_segment():
    assert parse_markup("Hello there.") == Markup((Segment("Hello there."),))


@pytest.mark.parametrize("tag, seconds", [
    ('<break time="500ms" />', 0.5), ('<break time="1.5s"/>', 1.5), ("<break time='2s'/>", 2.0),
    ('<BREAK TIME="250MS"/>', 0.25), ('<break time="1S">', 1.0), ('<break time=" 0.75s "/>', 0.75),
    ('<break time=".5s"/>', 0.5), ('<break time="0ms"/>', 0.0),
])
def test_a_break_tag_splits_the_text_with_its_pause(tag, seconds):
    assert parse_markup(f"Before it {tag} after it.") == \
        Markup((Segment("Before it"), Segment("after it.", seconds)))


def test_a_break_at_the_start_is_a_pause_before_the_first_segment():
    assert parse_markup('<break time="1s"/>Hello.').segments == (Segment("Hello.", 1.0),)


def test_a_break_at_the_end_is_the_pause_after_the_last_segment():
    assert parse_markup('Hello.<break time="1s"/>') == Markup((Segment("Hello."),), pause_after_s=1.0)


def test_adjacent_breaks_add_up():
    assert parse_markup('A. <break time="1s"/> <break time="500ms"/> B.').segments == \
        (Segment("A."), Segment("B.", 1.5))


def test_other_angle_brackets_stay_text():
    text = "If a < b and <breakfast> or <b>bold</b>, say so."
    assert parse_markup(text) == Markup((Segment(text),))


def test_breaks_alone_leave_no_segment():
    assert parse_markup('<break time="1s"/>').segments == ()


def test_a_break_without_time_is_refused_with_its_position():
    error = _error('Hi.\nThen <break/> more.')
    assert (error.line, error.column, error.element) == (2, 6, "break")
    assert str(error) == '<break> needs a time, such as <break time="500ms" /> (at line 2, column 6)'


@pytest.mark.parametrize("value, problem", [
    ("5 seconds", "must be a number of milliseconds or seconds"), ("500", "must be a number of milliseconds"),
    ("1.5m", "must be a number of milliseconds"), ("-1s", "must not be negative"),
])
def test_a_bad_break_time_is_refused(value, problem):
    error = _error(f'Hi <break time="{value}"/>')
    assert problem in str(error) and repr(value) in str(error) and error.column == 4


def test_a_break_over_the_per_break_bound_is_refused():
    error = _error(f'Hi <break time="{MAX_BREAK_S + 0.5:g}s"/>')
    assert f"a break lasts at most {MAX_BREAK_S:g} s" in str(error)


def test_breaks_over_the_per_request_bound_are_refused_at_the_one_that_crosses_it():
    count = int(MAX_TOTAL_BREAK_S // MAX_BREAK_S)
    text = "A." + f'<break time="{MAX_BREAK_S:g}s"/>B.' * count + '<break time="1s"/>C.'
    error = _error(text)
    assert f"add up to at most {MAX_TOTAL_BREAK_S:g} s" in str(error)
    assert error.column == text.rindex("<break") + 1


def test_a_break_with_another_attribute_is_refused():
    assert "takes only a time attribute, got 'strength'" in str(_error('Hi <break strength="weak"/>'))


def test_an_unclosed_break_tag_is_refused():
    assert "malformed <break> tag" in str(_error('Hi <break time="1s" and more'))


def test_an_unquoted_break_time_is_refused():
    assert "malformed <break> tag" in str(_error("Hi <break time=1s/>"))


def test_an_unknown_input_format_is_refused():
    with pytest.raises(TextInputError, match="input_format must be one of text, ssml, got 'html'"):
        parse_markup("Hi.", "html")


# ------------------------------------------------------------------------------------- SSML
def test_ssml_text_is_spoken():
    assert _ssml("Hello &amp; welcome.") == Markup((Segment("Hello & welcome."),))


def test_ssml_speak_takes_its_usual_attributes():
    text = ('<?xml version="1.0"?><speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" '
            'xml:lang="en-US">Hi.</speak>')
    assert parse_markup(text, "ssml").segments == (Segment("Hi."),)


def test_ssml_paragraphs_and_sentences_end_paragraphs_for_chunking():
    markup = _ssml("<p><s>One</s><s>Two</s></p><p>Three</p>")
    assert [part.strip() for part in markup.segments[0].text.split("\n\n") if part.strip()] == \
        ["One", "Two", "Three"]


def test_ssml_break_time():
    assert _ssml('One.<break time="300ms"/>Two.').segments == (Segment("One."), Segment("Two.", 0.3))


@pytest.mark.parametrize("strength", sorted(BREAK_STRENGTHS))
def test_ssml_break_strength_maps_to_its_length(strength):
    assert _ssml(f'One.<break strength="{strength}"/>Two.').segments[1].pause_before_s == BREAK_STRENGTHS[strength]


def test_ssml_break_without_attributes_is_medium():
    assert _ssml("One.<break/>Two.").segments[1].pause_before_s == BREAK_STRENGTHS["medium"]


@pytest.mark.parametrize("rate, speed", [("80%", 0.8), ("150%", 1.5), *PROSODY_RATES.items()])
def test_ssml_prosody_rate_around_the_whole_text_sets_the_speed(rate, speed):
    markup = _ssml(f'<prosody rate="{rate}"><p>One.</p><break time="1s"/><p>Two.</p></prosody>')
    assert markup.speed == pytest.approx(speed)
    assert markup.segments == (Segment("One."), Segment("Two.", 1.0))


def test_ssml_without_prosody_sets_no_speed():
    assert _ssml("Hi.").speed is None


def test_ssml_unsupported_element_is_named_with_its_position():
    error = _error('<speak>\n  Hi <emphasis level="strong">there</emphasis>.</speak>', "ssml")
    assert (error.element, error.line, error.column) == ("emphasis", 2, 6)
    assert str(error).startswith("<emphasis> is not supported; the SSML subset is speak, p, s, break, prosody")


def test_ssml_root_must_be_speak():
    assert "the SSML root must be <speak>, got <p>" in str(_error("<p>Hi.</p>", "ssml"))


def test_ssml_unsupported_attribute_is_named():
    error = _error('<speak><prosody pitch="high">Hi.</prosody></speak>', "ssml")
    assert "<prosody> does not take the attribute 'pitch'" in str(error) and error.column == 8


def test_ssml_prosody_around_part_of_the_text_is_refused():
    error = _error('<speak>Hi. <prosody rate="slow">Slowly.</prosody></speak>', "ssml")
    assert "must enclose all of the text" in str(error) and (error.element, error.column) == ("prosody", 12)


def test_ssml_nested_prosody_is_refused():
    error = _error('<speak><prosody rate="slow"><prosody rate="fast">Hi.</prosody></prosody></speak>', "ssml")
    assert "only one <prosody> is supported" in str(error) and error.column == 29


@pytest.mark.parametrize("rate, problem", [("loud", "must be a percentage"), ("+10%", "must be a percentage"),
                                           ("10%", "speed must be between 0.25 and 4")])
def test_ssml_bad_prosody_rate_is_refused(rate, problem):
    assert problem in str(_error(f'<speak><prosody rate="{rate}">Hi.</prosody></speak>', "ssml"))


def test_ssml_bad_break_strength_is_refused():
    assert "break strength 'huge' is not one of" in str(_error('<speak>Hi.<break strength="huge"/></speak>', "ssml"))


def test_ssml_break_with_time_and_strength_is_refused():
    assert "time or strength, not both" in \
        str(_error('<speak>Hi.<break time="1s" strength="weak"/></speak>', "ssml"))


def test_ssml_break_with_text_inside_is_refused():
    assert "<break> must be empty" in str(_error('<speak>Hi.<break time="1s">oops</break></speak>', "ssml"))


def test_ssml_break_bounds_are_those_of_text():
    assert "a break lasts at most" in str(_error('<speak>Hi.<break time="11s"/></speak>', "ssml"))


def test_ssml_not_well_formed_is_refused_with_the_parser_position():
    error = _error("<speak>Hi.\n<p>open</speak>", "ssml")
    assert str(error) == "the SSML is not well-formed XML: mismatched tag (at line 2, column 10)"


def test_ssml_doctype_is_refused_before_its_entities():
    bomb = ('<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
            "<speak>&b;</speak>")
    assert "must not contain a document type declaration" in str(_error(bomb, "ssml"))


def test_ssml_undefined_entity_is_refused():
    assert "undefined entity" in str(_error("<speak>&nbsp;Hi.</speak>", "ssml"))


def test_ssml_processing_instruction_is_refused():
    assert "processing instructions" in str(_error("<speak><?php echo 1; ?>Hi.</speak>", "ssml"))
