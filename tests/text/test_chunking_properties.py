"""Invariants of split_into_chunks over a seeded random corpus of mixed scripts and layouts."""
from __future__ import annotations

import random

import pytest

from chorus.text import split_into_chunks

_WORDS = (
    "the quick brown fox Dr. Smith e.g. 3.14 $5.50 1,234 U.S. etc. well-known "
    "Привет мир Γεια σου שלום עולם مرحبا بالعالم नमस्ते दुनिया "
    "你好世界今天天气很好 こんにちは世界 안녕하세요 😀 👍🏽 e\u0301te\u0301"
).split()
_MARKS = ("", "", "", ",", ";", ":", ".", "!", "?", "...", "…", "。", "，", "、", "？", "؟", "।", '."', ".)", " —")
_SPACES = (" ", " ", " ", "  ", "\n", "\t", "\n\n", " \n \n ")


def _random_text(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(0, 120)):
        word = rng.choice(_WORDS)
        if rng.random() < 0.05:
            word = word * rng.randint(5, 40)  # sometimes a "word" longer than any bound
        words.append(word + rng.choice(_MARKS) + rng.choice(_SPACES))
    return "".join(words)


def _corpus(count: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(_random_text(rng), rng.choice((20, 37, 60, 100, 400))) for _ in range(count)]


CORPUS = _corpus(300, seed=20240607)


def _walk(text: str, chunks: list[str]) -> list[int]:
    """Positions in the whitespace-normalised text where each chunk ends; fails if the chunks
    are not consecutive pieces of it in order."""
    flat = " ".join(text.split())
    position, ends = 0, []
    for chunk in chunks:
        assert flat.startswith(chunk, position), (chunk, flat[position:position + len(chunk) + 10])
        position += len(chunk)
        ends.append(position)
        if position < len(flat) and flat[position] == " ":
            position += 1
    assert position == len(flat)
    return ends


@pytest.mark.parametrize("index", range(0, len(CORPUS), 30))
def test_chunks_are_the_text_in_order_with_only_whitespace_changed(index):
    for text, max_chars in CORPUS[index:index + 30]:
        _walk(text, split_into_chunks(text, max_chars=max_chars))


@pytest.mark.parametrize("index", range(0, len(CORPUS), 30))
def test_every_chunk_respects_the_bound(index):
    for text, max_chars in CORPUS[index:index + 30]:
        assert all(0 < len(c) <= max_chars for c in split_into_chunks(text, max_chars=max_chars))


@pytest.mark.parametrize("index", range(0, len(CORPUS), 30))
def test_chunks_are_stripped_with_single_spaces(index):
    for text, max_chars in CORPUS[index:index + 30]:
        assert all(c == " ".join(c.split()) for c in split_into_chunks(text, max_chars=max_chars))


def test_cuts_inside_latin_words_happen_only_for_words_over_the_bound():
    rng = random.Random(7)
    for _ in range(200):
        words = [rng.choice(("a", "bb", "word", "longer", "sentence", "x" * 15)) for _ in range(rng.randint(1, 80))]
        text = " ".join(w + rng.choice(("", "", ",", ".")) for w in words)
        flat = " ".join(text.split())
        chunks = split_into_chunks(text, max_chars=rng.choice((20, 33, 50)))
        for end in _walk(text, chunks)[:-1]:
            assert flat[end] == " ", (flat[end - 10:end + 10], chunks)
