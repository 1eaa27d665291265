"""Sentence splitting per language, and the guard around the segmenter."""
from __future__ import annotations

import pytest

import chorus.text.sentences as sentences
from chorus.text import split_into_chunks, split_sentences

NON_LATIN = {
    "zh": ("今天很好。你好吗？我很好！", ["今天很好。", "你好吗？", "我很好！"]),
    "ja": ("今日はいい天気です。散歩しましょう！どこへ行く？", ["今日はいい天気です。", "散歩しましょう！", "どこへ行く？"]),
    "ar": ("كيف حالك؟ أنا بخير. شكرا!", ["كيف حالك؟ ", "أنا بخير. ", "شكرا!"]),
    "hi": ("आज मौसम अच्छा है। हम चलेंगे। ठीक है?", ["आज मौसम अच्छा है। ", "हम चलेंगे। ", "ठीक है?"]),
    "ru": ("Привет. Как дела? Всё хорошо.", ["Привет. ", "Как дела? ", "Всё хорошо."]),
    "el": ("Γεια σου. Τι κάνεις; Καλά είμαι.", ["Γεια σου. ", "Τι κάνεις; ", "Καλά είμαι."]),
    "he": ("שלום. מה שלומך? אני בסדר.", ["שלום. ", "מה שלומך? ", "אני בסדר."]),
}


class PanicException(BaseException):
    """Stands in for pyo3's panic type, which derives from BaseException."""


@pytest.mark.parametrize("language", sorted(NON_LATIN))
def test_non_latin_scripts_split_into_sentences(language):
    text, expected = NON_LATIN[language]
    assert split_sentences(text, language) == expected


def test_chinese_closing_quote_stays_with_its_sentence():
    assert split_sentences("他说：“你好。”然后走了。", "zh") == ["他说：“你好。”", "然后走了。"]


def test_russian_abbreviation_does_not_end_a_sentence():
    assert split_sentences("Ул. Ленина, д. 5. Там живёт он.", "ru") == ["Ул. Ленина, д. 5. ", "Там живёт он."]


def test_a_single_capital_initial_is_joined_to_its_name():
    assert split_sentences("M. Dupont est arrivé. Il fait beau !", "fr") == ["M. Dupont est arrivé. ", "Il fait beau !"]


def test_sentences_reassemble_to_the_paragraph():
    paragraph = 'He said "Stop!" Then he left. \u201cWhy?\u201d She asked. 今天很好。'
    assert "".join(split_sentences(paragraph)) == paragraph


def test_empty_paragraph_has_no_sentences():
    assert split_sentences("") == []


def test_segmenter_panic_keeps_the_paragraph_whole(monkeypatch):
    def panic(language, text):
        raise PanicException("byte index 3 is not a char boundary")

    monkeypatch.setattr(sentences.sentencex, "segment", panic)
    assert split_sentences("One. Two.") == ["One. Two."]


def test_segmenter_failure_still_gives_bounded_chunks(monkeypatch):
    def fail(language, text):
        raise RuntimeError("broken")

    monkeypatch.setattr(sentences.sentencex, "segment", fail)
    chunks = split_into_chunks("First sentence here. " * 10, max_chars=50)
    assert all(len(c) <= 50 for c in chunks) and " ".join(chunks) == ("First sentence here. " * 10).strip()


def test_segmenter_output_that_loses_text_is_not_used(monkeypatch):
    monkeypatch.setattr(sentences.sentencex, "segment", lambda language, text: ["One."])
    assert split_sentences("One. Two.") == ["One. Two."]


def test_keyboard_interrupt_in_the_segmenter_is_not_swallowed(monkeypatch):
    def interrupt(language, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(sentences.sentencex, "segment", interrupt)
    with pytest.raises(KeyboardInterrupt):
        split_sentences("One. Two.")
