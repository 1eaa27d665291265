"""The voice-agent WebSocket's text threshold (chorus/server/text_pieces.py), a pure function of
the deltas and their times."""
from __future__ import annotations

import math
import random
import re

import pytest

from chorus.server.text_pieces import Chunking, TextPieces, _words

SMALL = Chunking(min_chars=10, max_chars=40, max_wait_ms=500)  # clause cuts from 20 characters


def texts(pieces):
    return [p.text for p in pieces]


def test_a_sentence_end_cuts_once_the_next_sentence_begins():
    t = TextPieces(Chunking())
    assert t.push("Sure, I can help with that.", 0.0) == []  # "that." may be "that.5": wait for more
    assert texts(t.push(" The", 0.01)) == ["Sure, I can help with that."]
    assert t.buffered == len("The")


def test_a_sentence_shorter_than_min_chars_waits_for_the_next():
    t = TextPieces(Chunking(min_chars=20))
    assert t.push("Hi there. How", 0.0) == []
    assert texts(t.push(" are you doing today? I", 0.01)) == ["Hi there. How are you doing today?"]


@pytest.mark.parametrize("text", ["It costs 3.5 dollars and that is all there is to it",
                                  "Mr. Smith went to the market with all of his friends"])
def test_decimals_and_abbreviations_do_not_end_a_sentence(text):
    assert TextPieces(Chunking(min_chars=3, max_chars=200)).push(text, 0.0) == []


def test_a_line_break_ends_a_sentence():
    t = TextPieces(SMALL)
    assert texts(t.push("first item of the list\n- second", 0.0)) == ["first item of the list"]


def test_a_clause_cuts_only_once_the_piece_holds_half_of_max_chars():
    t = TextPieces(SMALL)
    assert t.push("one two, three four five", 0.0) == []  # "one two," is shorter than 20
    pieces = t.push(" six seven, eight", 0.01)
    assert texts(pieces) == ["one two, three four five six seven,"]


def test_max_chars_cuts_at_the_last_word_break_within_it():
    t = TextPieces(SMALL)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    pieces = t.push(words, 0.0)
    assert texts(pieces) == ["alpha beta gamma delta epsilon zeta eta"]
    assert all(len(p.text) <= SMALL.max_chars for p in pieces)


def test_a_word_longer_than_max_chars_is_cut_inside():
    t = TextPieces(SMALL)
    pieces = t.push("x" * 100, 0.0)
    assert [len(p.text) for p in pieces] == [40, 40]


def test_max_wait_cuts_two_finished_words_and_keeps_the_unfinished_one():
    t = TextPieces(SMALL)
    assert t.push("Hello big", 0.0) == []
    assert t.deadline() == pytest.approx(0.5)
    assert t.poll(0.6) == []  # "big" may go on ("bigger"): one finished word is not enough
    pieces = t.push(" wor", 0.7)
    assert texts(pieces) == ["Hello big"] and pieces[0].waited_s == pytest.approx(0.7)
    assert t.deadline() == pytest.approx(0.7 + 0.5)  # the rest waits from its own arrival


def test_max_wait_does_not_cut_before_its_time():
    t = TextPieces(SMALL)
    assert t.push("Hello big world ", 0.0) == []
    assert t.poll(0.49) == []
    assert texts(t.poll(0.5)) == ["Hello big world"]


def test_the_time_cut_is_due_exactly_when_its_deadline_says():
    # a timer armed for deadline() that fires a hair early must find the deadline still ahead
    # (so it is armed again), and one that fires on it must cut: one predicate, no float gap
    # (50 ms is not a binary fraction: arrival + 0.05 - arrival often differs from 0.05)
    chunking = Chunking(min_chars=20, max_chars=160, max_wait_ms=50)
    for arrival in [i * 0.1 + 1000 for i in range(200)]:
        t = TextPieces(chunking)
        t.push("Hello big world ", arrival)
        deadline = t.deadline()
        early = math.nextafter(deadline, 0.0)
        assert t.poll(early) == [] and t.deadline() > early
        assert texts(t.poll(deadline)) == ["Hello big world"], arrival


def test_one_word_is_never_a_piece_unless_flushed():
    t = TextPieces(SMALL)
    assert t.push("Hello ", 0.0) == [] and t.poll(100.0) == []
    assert texts(t.flush(100.0)) == ["Hello"]


def test_flush_cuts_a_long_buffer_by_the_same_rules():
    t = TextPieces(SMALL)
    text = "This is the first sentence. And a second one follows here, longer than the first one."
    whole = t.push(text, 0.0) + t.flush(1.0)
    assert all(len(p.text) <= SMALL.max_chars for p in whole)
    assert " ".join(texts(whole)) == text


def test_a_remainder_without_letters_or_digits_is_not_spoken():
    t = TextPieces(SMALL)
    assert texts(t.push("Hello big world ", 0.0) + t.poll(1.0)) == ["Hello big world"]
    t.push("...", 1.1)
    assert t.flush(1.2) == []


def test_cjk_punctuation_ends_sentences_and_clauses_without_spaces():
    t = TextPieces(Chunking(min_chars=4, max_chars=40))
    assert texts(t.push("你好，我是你的语音助手。今天", 0.0)) == ["你好，我是你的语音助手。"]
    t = TextPieces(Chunking(min_chars=10, max_chars=30))  # clause cuts from 15 characters
    assert texts(t.push("今天天气很好，我们一起去公园散步吧，好不好呢", 0.0)) == ["今天天气很好，我们一起去公园散步吧，"]


def test_cjk_text_without_marks_is_cut_between_characters_at_max_wait():
    t = TextPieces(SMALL)
    t.push("今天天气很好", 0.0)
    assert texts(t.poll(0.5)) == ["今天天气很"]  # the last character may start a word


def test_offsets_index_the_turns_whole_text():
    rng = random.Random(0)
    words = ("the quick brown fox jumps over a lazy dog , . ; : ! ? — 你好 。 3.5 Mr. e.g. \n").split(" ")
    for trial in range(200):
        chunking = Chunking(min_chars=rng.randint(1, 30), max_chars=rng.randint(30, 80),
                            max_wait_ms=rng.choice([0, 100, 500]))
        t, whole, now, pieces = TextPieces(chunking), "", 0.0, []
        for _ in range(rng.randint(1, 60)):
            delta = rng.choice(["", " "]) + rng.choice(words)
            now += rng.random() * 0.2
            whole += delta
            pieces += t.push(delta, now) + (t.poll(now) if rng.random() < 0.3 else [])
        pieces += t.flush(now)
        ends = [0] + [p.end for p in pieces]
        for p, before in zip(pieces, ends):
            assert whole[p.start:p.end] == p.text and p.start >= before and p.text.strip() == p.text
            assert len(p.text) <= chunking.max_chars
        for p in pieces[:-1]:
            assert _words(p.text) >= 2, (trial, p)
        spoken = "".join(whole[p.start:p.end] for p in pieces)
        assert re.sub(r"\W", "", spoken) == re.sub(r"\W", "", whole)  # every letter and digit, once, in order


@pytest.mark.parametrize("fields, message", [
    (dict(min_chars=0), "min_chars"), (dict(min_chars=50, max_chars=40), "min_chars"),
    (dict(max_wait_ms=-1), "max_wait_ms"), (dict(max_chars=1, min_chars=1), "max_chars"),
    (dict(min_chars=True), "integer"), (dict(max_wait_ms=1.5), "integer")])
def test_bad_sizes_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        Chunking(**fields)


def test_a_cut_at_max_chars_never_splits_a_break_tag():
    t = TextPieces(SMALL)
    pieces = t.push('One two three four five six <break time="500ms"/> seven eight nine ten', 0.0)
    pieces += t.flush(1.0)
    assert all(p.text.count("<") == p.text.count(">") for p in pieces), texts(pieces)
    assert any('<break time="500ms"/>' in p.text for p in pieces)


def test_a_time_cut_waits_for_a_break_tag_to_close():
    t = TextPieces(SMALL)
    assert t.push('Hello there my friend <break time=', 0.0) == []
    pieces = t.poll(0.6)  # the time threshold cuts before the open tag, not inside it
    assert texts(pieces) == ["Hello there my friend"]
    rest = texts(t.push('"1s"/> and then more', 0.7) + t.flush(0.8))
    assert rest[0].startswith('<break time="1s"/>') and " ".join(rest) == '<break time="1s"/> and then more'
