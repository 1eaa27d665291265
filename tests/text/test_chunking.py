from __future__ import annotations

from importlib import resources

import pytest

from chorus.text import DEFAULT_MAX_CHARS, UnsupportedLanguageError, split_into_chunks, split_sentences


def _squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.fixture(scope="module")
def benchmark_text() -> str:
    # the public benchmark workload of chatterbox-vllm, shipped for `chorus bench`
    return resources.files("chorus.assets").joinpath("benchmark-text-1.txt").read_text(encoding="utf-8")


def test_benchmark_text_gives_about_150_chunks_at_400_characters(benchmark_text):
    assert 120 <= len(split_into_chunks(benchmark_text, max_chars=400)) <= 180


def test_benchmark_text_loses_nothing_but_whitespace(benchmark_text):
    assert _squeeze("".join(split_into_chunks(benchmark_text))) == _squeeze(benchmark_text)


def test_benchmark_chunks_respect_the_limit(benchmark_text):
    assert max(len(c) for c in split_into_chunks(benchmark_text)) <= DEFAULT_MAX_CHARS


def test_short_sentences_are_packed_together():
    assert split_into_chunks("One. Two. Three.", max_chars=100) == ["One. Two. Three."]


def test_sentences_split_when_the_limit_is_reached_into_balanced_chunks():
    # greedy filling would give 54 + 15 characters; the same two chunks can be 27 + 42
    text = "The first sentence is here. The second one follows it. A third closes."
    assert split_into_chunks(text, max_chars=60) == [
        "The first sentence is here.", "The second one follows it. A third closes.",
    ]


def test_packing_keeps_the_fewest_chunks_and_shortens_the_longest():
    sentences = [f"Sentence number {i} says a few more words here." for i in range(18)]  # 47-48 chars
    text = " ".join(sentences)
    chunks = split_into_chunks(text, max_chars=400)
    greedy_count = -(-len(text) // 400)
    assert len(chunks) == greedy_count == 3
    assert max(map(len, chunks)) - min(map(len, chunks)) <= 50  # 6 sentences each, not 8 + 8 + 2
    assert " ".join(chunks) == text


def test_closing_quotes_stay_with_their_sentence():
    assert split_sentences('He said "Stop!" Then he left. \u201cWhy?\u201d She asked.') == [
        'He said "Stop!" ', "Then he left. ", "\u201cWhy?\u201d ", "She asked.",
    ]


def test_abbreviations_and_initials_do_not_end_sentences():
    text = "Dr. Smith met J. R. R. Tolkien, e.g. at St. Giles. Then they left."
    assert split_sentences(text) == ["Dr. Smith met J. R. R. Tolkien, e.g. at St. Giles. ", "Then they left."]


def test_lower_case_continuation_does_not_end_a_sentence():
    assert split_sentences('"Really?" he asked. Yes.') == ['"Really?" he asked. ', "Yes."]


def test_decimals_and_urls_do_not_end_sentences():
    assert split_sentences("Pi is 3.14 and see example.com/a.b for more. Done.") == [
        "Pi is 3.14 and see example.com/a.b for more. ", "Done.",
    ]


def test_cjk_sentence_enders_split_without_spaces():
    assert split_sentences("今天很好。你好吗？我很好！") == ["今天很好。", "你好吗？", "我很好！"]


def test_arabic_and_devanagari_enders():
    assert split_sentences("كيف حالك؟ أنا بخير.") == ["كيف حالك؟ ", "أنا بخير."]
    assert split_sentences("आज मौसम अच्छा है। हम चलेंगे।") == ["आज मौसम अच्छा है। ", "हम चलेंगे।"]


def test_paragraphs_are_never_merged():
    assert split_into_chunks("First paragraph.\n\nSecond paragraph.", max_chars=200) == [
        "First paragraph.", "Second paragraph.",
    ]


def test_single_newlines_become_spaces():
    assert split_into_chunks("A line\nwrapped here.", max_chars=100) == ["A line wrapped here."]


def test_long_sentence_splits_at_a_comma():
    text = "This sentence has a first clause that runs long, and a second clause that also runs on and on."
    chunks = split_into_chunks(text, max_chars=60)
    assert chunks[0].endswith("long,") and all(len(c) <= 60 for c in chunks)
    assert _squeeze("".join(chunks)) == _squeeze(text)


def test_long_sentence_without_commas_splits_at_spaces():
    text = " ".join(["word"] * 40) + "."
    chunks = split_into_chunks(text, max_chars=50)
    assert all(len(c) <= 50 for c in chunks) and all(not c.startswith(" ") for c in chunks)
    assert _squeeze("".join(chunks)) == _squeeze(text)


def test_text_without_spaces_is_cut_hard_into_balanced_pieces():
    text = "好" * 130
    chunks = split_into_chunks(text, max_chars=50)
    assert [len(c) for c in chunks] == [44, 43, 43]


def test_long_chinese_sentence_splits_at_an_ideographic_comma():
    text = "甲" * 30 + "，" + "乙" * 30 + "。"
    assert split_into_chunks(text, max_chars=40) == ["甲" * 30 + "，", "乙" * 30 + "。"]


@pytest.mark.parametrize("empty", ["", "  \n\n  "])
def test_empty_text_gives_no_chunks(empty):
    assert split_into_chunks(empty) == []


def test_bad_max_chars_is_rejected():
    with pytest.raises(ValueError, match="max_chars"):
        split_into_chunks("Hi.", max_chars=5)


def test_non_string_is_rejected():
    with pytest.raises(TypeError):
        split_into_chunks(None)


def test_abbreviations_times_and_dates_stay_in_one_sentence():
    text = "Dr. Smith met Mr. Jones at 5 p.m. on Jan. 3. They talked."
    assert split_sentences(text) == ["Dr. Smith met Mr. Jones at 5 p.m. on Jan. 3. ", "They talked."]


def test_a_decimal_does_not_end_a_sentence():
    assert split_sentences("Pi is 3.14159. It never ends.") == ["Pi is 3.14159. ", "It never ends."]


def test_nested_quotes_stay_in_their_sentence():
    text = "She said, \"He told me 'no.' Then he left.\" We waited."
    assert split_sentences(text) == ["She said, \"He told me 'no.' Then he left.\" ", "We waited."]


def test_ellipses_end_a_sentence_only_before_a_new_one():
    assert split_sentences("Wait... what? I think so... but not sure. Fine.") == [
        "Wait... what? ", "I think so... but not sure. ", "Fine.",
    ]


def test_text_without_punctuation_is_one_chunk():
    text = "no punctuation at all just words going on and on"
    assert split_into_chunks(text, max_chars=100) == [text]


def test_long_text_without_punctuation_is_cut_at_spaces():
    text = " ".join(["alpha", "beta", "gamma", "delta"] * 12)
    chunks = split_into_chunks(text, max_chars=100)
    assert " ".join(chunks) == text


def test_sentence_over_twice_the_limit_is_cut_at_every_comma_near_an_equal_share():
    text = ("This clause runs along for a while, then another clause follows it closely, "
            "and a third one ends the long sentence here.")
    assert split_into_chunks(text, max_chars=50) == [
        "This clause runs along for a while,", "then another clause follows it closely,",
        "and a third one ends the long sentence here.",
    ]


def test_sentence_over_twice_the_limit_without_commas_gets_balanced_pieces():
    text = " ".join(["alpha", "beta", "gamma", "delta"] * 12) + "."
    lengths = [len(c) for c in split_into_chunks(text, max_chars=100)]
    assert len(lengths) == 3 and max(lengths) - min(lengths) <= 6


def test_a_slightly_long_sentence_is_halved_not_cut_into_a_tiny_tail():
    text = "word " * 21  # 104 characters
    lengths = [len(c) for c in split_into_chunks(text, max_chars=100)]
    assert len(lengths) == 2 and min(lengths) >= 40


def test_hard_cut_does_not_break_a_latin_word_inside_cjk_text():
    text = "好" * 45 + "iPhone" + "好" * 45
    chunks = split_into_chunks(text, max_chars=50)
    assert any(c.startswith("iPhone") or c.endswith("iPhone") for c in chunks)


def test_hard_cut_keeps_combining_marks_with_their_letter():
    chunks = split_into_chunks("e\u0301" * 31, max_chars=25)
    assert all(not c.startswith("\u0301") for c in chunks)


def test_hard_cut_keeps_an_emoji_sequence_whole():
    family = "\U0001F468\u200d\U0001F469\u200d\U0001F467"
    chunks = split_into_chunks(family * 21, max_chars=24)
    assert all(c.startswith("\U0001F468") and c.endswith("\U0001F467") for c in chunks)


def test_arabic_comma_is_a_clause_boundary():
    text = "كلمة " * 6 + "كلمة، " + "كلمة " * 7
    chunks = split_into_chunks(text, max_chars=60)
    assert chunks[0].endswith("،")


def test_mixed_language_paragraphs_stay_apart():
    text = "An English paragraph. It has two sentences.\n\n这是中文。第二句。\n\nСнова по-русски."
    assert split_into_chunks(text, max_chars=200, language="en") == [
        "An English paragraph. It has two sentences.", "这是中文。第二句。", "Снова по-русски.",
    ]


def test_language_is_accepted_in_any_case():
    assert split_into_chunks("你好。再见。", max_chars=20, language="ZH") == ["你好。再见。"]


def test_unknown_language_is_rejected():
    with pytest.raises(UnsupportedLanguageError, match="xx"):
        split_into_chunks("Hello.", language="xx")


def test_a_hyphen_between_spaces_is_a_clause_boundary():
    text = ("The committee met for several hours on the first day of the session - they argued about "
            "budgets and schedules and staffing and the long list of complaints piled up since spring.")
    chunks = split_into_chunks(text, max_chars=120)
    assert chunks[0].endswith("session -") and len(chunks) == 2


def test_a_double_hyphen_is_a_clause_boundary_with_or_without_spaces():
    for dash in (" -- ", "--"):
        text = ("The committee met for several hours on the first day of the session" + dash + "they argued "
                "about budgets and schedules and staffing and the long list of complaints piled up since spring.")
        chunks = split_into_chunks(text, max_chars=120)
        assert chunks[0].endswith("session" + dash.rstrip()) and len(chunks) == 2


def test_hyphenated_words_are_never_cut():
    text = " ".join(["a well-known long-standing state-of-the-art word"] * 6) + "."
    chunks = split_into_chunks(text, max_chars=60)
    flat = " ".join(chunks)
    assert flat == text and all(not c.startswith("-") and not c.endswith("-") for c in chunks)


def test_a_long_sentence_is_cut_into_near_equal_pieces_not_filled_then_left_over():
    # greedy filling would give 100 + 100 + 30 characters; the longest chunk sets the T3 time
    text = " ".join(["word"] * 46) + "."
    lengths = [len(c) for c in split_into_chunks(text, max_chars=100)]
    assert len(lengths) == 3 and max(lengths) <= 80
