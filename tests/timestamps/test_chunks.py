"""From what the pipeline has to a chunk's timings: tokens found in the text, the method
chosen by coverage, timings moved to the response's speed, and the API's shapes."""
from __future__ import annotations

import pytest
import torch

from chorus.timestamps import estimate
from chorus.timestamps.chunks import at_speed, chunk_timings, shifted, token_spans
from chorus.timestamps.shapes import character_lists, characters, method, word_lists, words, words_ms


def test_tokens_are_found_in_order_case_insensitively():
    assert token_spans("Hello there", ["hel", "lo", " ", "There"]) == [(0, 3), (3, 5), (5, 6), (6, 11)]


def test_a_token_not_in_the_text_gets_no_span():
    assert token_spans("hi you", ["[en]", "hi", " ", "y", "ou"]) == [None, (0, 2), (2, 3), (3, 4), (4, 6)]


def test_a_covered_chunk_is_timed_by_alignment():
    spans = [None, (0, 2), (2, 3), (3, 6), None]
    alignment = torch.eye(5)[[1, 1, 2, 3, 3, 4]]  # speech tokens on "hi", " ", "you", then EOT
    assert chunk_timings("hi you", (0.0, 1.0), alignment, spans).method == "alignment"


def test_a_word_no_token_covers_falls_back_to_the_estimate():
    spans = [None, (0, 2), None, None, None]  # "you" was rewritten by the tokenizer
    timings = chunk_timings("hi you", (0.0, 1.0), torch.eye(5)[[1, 2, 3, 4]], spans)
    assert timings == estimate("hi you", (0.0, 1.0))


def test_speed_scales_times_after_the_silence_before_the_chunk():
    timings = estimate("one two three", (0.5, 2.5))
    fast = at_speed(timings, 0.5, 2.0)
    assert [t for w in fast.words for t in (w.start, w.end)] == pytest.approx(
        [0.5 + (t - 0.5) / 2 for w in timings.words for t in (w.start, w.end)])
    assert fast.words[-1].end == pytest.approx(1.5)


def test_characters_spell_the_chunks_joined_by_a_space_with_the_gaps_timed():
    first, second = estimate("Hi there.", (0.0, 1.0)), estimate("Bye.", (1.0, 1.5))
    shaped = characters(["Hi there.", "Bye."], [first, second])
    assert "".join(shaped["characters"]) == "Hi there. Bye."
    starts, ends = shaped["character_start_times_seconds"], shaped["character_end_times_seconds"]
    assert all(s <= e for s, e in zip(starts, ends))
    assert starts == sorted(starts) and ends == sorted(ends)
    space = shaped["characters"].index(" ")
    assert (starts[space], ends[space]) == (ends[space - 1], starts[space + 1])


def test_words_and_method_of_several_chunks():
    chunks = [estimate("a b", (0.0, 1.0)), estimate("c", (1.0, 2.0))]
    assert [w["word"] for w in words(chunks)] == ["a", "b", "c"]
    assert method(chunks) == "estimate"


def test_shifted_moves_every_word_and_character_later():
    timings = estimate("one two", (0.0, 1.0))
    later = shifted(timings, 2.5)
    assert [t for w in later.words for t in (w.start, w.end)] == pytest.approx(
        [t + 2.5 for w in timings.words for t in (w.start, w.end)])
    assert later.characters[0].start == pytest.approx(2.5) and later.method == timings.method


def test_word_lists_are_the_words_as_parallel_lists():
    chunks = [estimate("a b", (0.0, 1.0)), estimate("c", (1.0, 2.0))]
    listed = word_lists(chunks)
    assert listed == {"words": [w["word"] for w in words(chunks)], "start": [w["start"] for w in words(chunks)],
                      "end": [w["end"] for w in words(chunks)]}


def test_character_lists_are_the_characters_as_parallel_lists():
    chunks = [estimate("Hi.", (0.0, 1.0))]
    shaped = characters(["Hi."], chunks, leading_space=True)
    listed = character_lists(["Hi."], chunks, leading_space=True)
    assert listed == {"characters": [" ", "H", "i", "."], "start": shaped["character_start_times_seconds"],
                      "end": shaped["character_end_times_seconds"]}


def test_words_ms_are_whole_milliseconds():
    assert words_ms([estimate("one", (0.25, 1.2504))]) == [("one", 250, 1250)]
