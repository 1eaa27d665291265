from __future__ import annotations

import pytest

from chorus.text import normalize_punctuation
from chorus.text.normalize import EMPTY_TEXT_REPLACEMENT
from chorus.text.sample_text import ENGLISH_PROSE, SAMPLE_SENTENCES
from tests.text.corpus import EDGE_CASES

ALL_TEXTS = EDGE_CASES + tuple(SAMPLE_SENTENCES.values()) + tuple(ENGLISH_PROSE.splitlines())


@pytest.fixture(scope="module")
def oracle_punc_norm(oracle):
    from chatterbox import mtl_tts, tts, tts_turbo

    return {"en": tts.punc_norm, "mtl": mtl_tts.punc_norm, "turbo": tts_turbo.punc_norm}


@pytest.mark.oracle
@pytest.mark.parametrize("style", ["en", "mtl", "turbo"])
def test_matches_reference_punc_norm_on_corpus(oracle_punc_norm, style):
    mismatches = [
        (text, normalize_punctuation(text, style), oracle_punc_norm[style](text))
        for text in ALL_TEXTS
        if normalize_punctuation(text, style) != oracle_punc_norm[style](text)
    ]
    assert not mismatches


def test_empty_text_becomes_the_stock_sentence():
    assert normalize_punctuation("", "en") == EMPTY_TEXT_REPLACEMENT


def test_whitespace_only_text_becomes_a_full_stop():
    assert normalize_punctuation(" \n\t ", "turbo") == "."


def test_first_letter_is_capitalised_before_whitespace_is_collapsed():
    assert normalize_punctuation("hello there", "en") == "Hello there."
    assert normalize_punctuation("  hello there", "en") == "hello there."


def test_replacements_may_leave_double_spaces():
    assert normalize_punctuation("Wait ... what", "en") == "Wait,  what."


def test_turbo_keeps_three_dots_spaced_hyphens_and_semicolons():
    assert normalize_punctuation("One... two - three; four", "turbo") == "One... two - three; four."
    assert normalize_punctuation("One... two - three; four", "en") == "One,  two, three,  four."


def test_all_styles_replace_the_ellipsis_character_colon_dashes_and_curly_quotes():
    for style in ("en", "mtl", "turbo"):
        assert normalize_punctuation("A… b: “c”—‘d’–e", style) == "A,  b, \"c\"-'d'-e."


def test_only_multilingual_accepts_cjk_sentence_endings():
    assert normalize_punctuation("你好。", "mtl") == "你好。"
    assert normalize_punctuation("你好。", "en") == "你好。."


def test_existing_final_punctuation_is_kept():
    for ending in ".!?-,":
        assert normalize_punctuation(f"Done{ending}", "en") == f"Done{ending}"


def test_unknown_style_is_rejected():
    with pytest.raises(ValueError, match="en, mtl, turbo"):
        normalize_punctuation("Hi", "fr")


def test_non_string_is_rejected():
    with pytest.raises(TypeError):
        normalize_punctuation(42, "en")
