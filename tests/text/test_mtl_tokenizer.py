from __future__ import annotations

import importlib.util
import unicodedata

import pytest

from chorus.text import (
    SUPPORTED_LANGUAGES,
    MissingLanguagePackageError,
    MultilingualTokenizer,
    TokenizerFileError,
    UnsupportedLanguageError,
    normalize_punctuation,
)
from chorus.text.language_steps import CangjieTable, hangul_to_jamo
from chorus.text.sample_text import SAMPLE_SENTENCES
from tests.text.corpus import EDGE_CASES

# kanji readings starting with は/へ get a leading space; katakana runs stay; voiced kana decompose
JAPANESE_EXTRAS = ("母は部屋へ行った。", "ハンバーガーとコーヒー", "がぎぐげご、パピプペポ", "東京タワーは高い！")
NEEDS_PACKAGE = {"he": "dicta_onnx", "zh": "spacy_pkuseg", "ja": "pykakasi"}


def _installed(language: str) -> bool:
    return importlib.util.find_spec(NEEDS_PACKAGE[language]) is not None


def fake_segmenter(text: str) -> list[str]:
    """Stands in for spacy_pkuseg: words are runs of two characters (deterministic)."""
    return [text[i:i + 2] for i in range(0, len(text), 2)]


@pytest.fixture(scope="module")
def strict(mtl_dir):
    return MultilingualTokenizer.from_file(mtl_dir / "grapheme_mtl_merged_expanded_v1.json")


@pytest.fixture(scope="module")
def lenient(mtl_dir):
    return MultilingualTokenizer.from_file(mtl_dir / "grapheme_mtl_merged_expanded_v1.json", lenient=True)


def _runnable(language: str) -> bool:
    # strict Hebrew also needs Dicta's model, which the reference never loads: compared in lenient mode
    return language not in NEEDS_PACKAGE or language == "zh" or (language != "he" and _installed(language))


@pytest.mark.oracle
@pytest.mark.parametrize("language", [lang for lang in SUPPORTED_LANGUAGES if lang != "zh"])
def test_ids_match_reference_for_every_language(strict, oracle_mtl, language):
    if not _runnable(language):
        pytest.skip(f"{language}: strict mode needs {NEEDS_PACKAGE[language]} and its model (lenient parity and "
                    f"the strict error are tested below and in test_language_models.py)")
    text = normalize_punctuation(SAMPLE_SENTENCES[language], "mtl")
    assert strict.encode(text, language) == oracle_mtl.encode(text, language_id=language)


@pytest.mark.oracle
def test_chinese_ids_match_reference_with_the_same_segmenter(mtl_dir, oracle_mtl):
    ours = MultilingualTokenizer.from_file(mtl_dir / "grapheme_mtl_merged_expanded_v1.json", segmenter=fake_segmenter)
    saved = oracle_mtl.cangjie_converter.segmenter
    oracle_mtl.cangjie_converter.segmenter = type("Seg", (), {"cut": staticmethod(fake_segmenter)})()
    try:
        for text in (SAMPLE_SENTENCES["zh"], "日曰月。", "中文 mixed with English 123。"):
            text = normalize_punctuation(text, "mtl")
            assert ours.encode(text, "zh") == oracle_mtl.encode(text, language_id="zh")
    finally:
        oracle_mtl.cangjie_converter.segmenter = saved


@pytest.mark.oracle
def test_lenient_chinese_without_cangjie_table_still_segments_like_reference(tmp_path, mtl_dir, oracle_tokenizers):
    lonely = tmp_path / "grapheme_mtl_merged_expanded_v1.json"
    lonely.write_bytes((mtl_dir / lonely.name).read_bytes())
    ours = MultilingualTokenizer.from_file(lonely, lenient=True, segmenter=fake_segmenter)
    reference = oracle_tokenizers.MTLTokenizer(str(lonely))  # offline: no table, only a warning
    reference.cangjie_converter.segmenter = type("Seg", (), {"cut": staticmethod(fake_segmenter)})()
    text = normalize_punctuation(SAMPLE_SENTENCES["zh"], "mtl")
    assert ours.encode(text, "zh") == reference.encode(text, language_id="zh")


@pytest.mark.oracle
@pytest.mark.parametrize("language", ["he", "ru", "zh"])
def test_lenient_mode_matches_reference_without_models(lenient, oracle_mtl, language):
    """Installed or not, without a Dicta model Hebrew is plain text in both (the reference's
    ``Dicta()`` call fails and is caught); Russian has no step; Chinese uses the same pkuseg
    model (the tiny default in PKUSEG_HOME) or, without spacy-pkuseg, no segmentation in both."""
    text = normalize_punctuation(SAMPLE_SENTENCES[language], "mtl")
    assert lenient.encode(text, language) == oracle_mtl.encode(text, language_id=language)


@pytest.mark.oracle
def test_edge_cases_match_reference_in_several_scripts(strict, oracle_mtl):
    for language in ("en", "fr", "ja", "ko", "ar", "el"):
        for raw in EDGE_CASES + JAPANESE_EXTRAS:
            text = normalize_punctuation(raw, "mtl")
            assert strict.encode(text, language) == oracle_mtl.encode(text, language_id=language), raw


@pytest.mark.parametrize("language", ["he", "zh"])
def test_missing_optional_package_names_what_to_install(strict, language):
    if _installed(language):
        pytest.skip(f"{NEEDS_PACKAGE[language]} is installed")
    with pytest.raises(MissingLanguagePackageError, match=NEEDS_PACKAGE[language]):
        strict.encode("Text.", language)


def test_missing_cangjie_table_names_the_file(tmp_path, mtl_dir):
    lonely = tmp_path / "grapheme_mtl_merged_expanded_v1.json"
    lonely.write_bytes((mtl_dir / lonely.name).read_bytes())
    tokenizer = MultilingualTokenizer.from_file(lonely, segmenter=fake_segmenter)
    with pytest.raises(TokenizerFileError, match="Cangjie5_TC.json"):
        tokenizer.encode("你好。", "zh")


def test_other_languages_work_without_the_cangjie_table(tmp_path, mtl_dir):
    lonely = tmp_path / "grapheme_mtl_merged_expanded_v1.json"
    lonely.write_bytes((mtl_dir / lonely.name).read_bytes())
    tokenizer = MultilingualTokenizer.from_file(lonely)
    assert tokenizer.encode("Bonjour.", "fr")[0] == tokenizer.token_id("[fr]")


def test_unknown_language_lists_the_supported_codes(strict):
    with pytest.raises(UnsupportedLanguageError, match="ar, da, de.*zh"):
        strict.encode("Hello.", "xx")


def test_language_code_is_case_insensitive(strict):
    assert strict.encode("Hallo.", "DE") == strict.encode("Hallo.", "de")


def test_language_tag_comes_first(strict):
    assert strict.encode("Hej.", "sv")[0] == strict.token_id("[sv]")


def test_text_is_lower_cased_and_decomposed(strict):
    assert strict.prepare_text("Été", "fr") == "[fr]" + unicodedata.normalize("NFKD", "été")


def test_cangjie_spelling_with_rank_suffix():
    table = CangjieTable.from_entries(["日\ta", "曰\ta", "月\tb"])
    assert table.encode_glyph("日") == "[cj_a][cj_.]"
    assert table.encode_glyph("曰") == "[cj_a][cj_1][cj_.]"
    assert table.encode_glyph("x") is None


def test_malformed_cangjie_entry_is_a_clear_error():
    with pytest.raises(TokenizerFileError, match="glyph<TAB>code"):
        CangjieTable.from_entries(["日 a"])


def test_hangul_syllables_become_conjoining_jamo():
    assert hangul_to_jamo(" 한글 ") == "\u1112\u1161\u11ab\u1100\u1173\u11af"
