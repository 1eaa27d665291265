from __future__ import annotations

import json

import pytest

from chorus.models.variants import get_variant
from chorus.text import (
    SUPPORTED_LANGUAGES,
    MultilingualTokenizer,
    normalize_punctuation,
    write_standin_tokenizer_files,
)
from chorus.text.sample_text import SAMPLE_SENTENCES
from chorus.text.standin import english_tokenizer_asset
from chorus.text.standin_gpt2 import PARALINGUISTIC_TAGS
from tests.text.reference import load_reference_gpt2


@pytest.mark.parametrize("variant", ["original", "multilingual", "turbo"])
def test_writes_exactly_the_official_file_names(tmp_path, variant):
    v = get_variant(variant)
    written = write_standin_tokenizer_files(v.tokenizer_kind, tmp_path)
    assert {p.name for p in written} == set(v.files.tokenizer) | set(v.files.optional)


def test_cangjie_table_is_optional(tmp_path):
    written = write_standin_tokenizer_files("mtl", tmp_path, include_cangjie=False)
    assert [p.name for p in written] == ["grapheme_mtl_merged_expanded_v1.json"]


@pytest.mark.parametrize("kind", ["en", "mtl", "gpt2"])
def test_output_is_deterministic(tmp_path, kind):
    first = write_standin_tokenizer_files(kind, tmp_path / "a")
    second = write_standin_tokenizer_files(kind, tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_english_file_is_the_real_one(tmp_path):
    (path,) = write_standin_tokenizer_files("en", tmp_path)
    assert path.read_bytes() == english_tokenizer_asset().read_bytes()


def test_mtl_vocabulary_has_the_real_size_and_special_ids(mtl_dir):
    tokenizer = MultilingualTokenizer.from_file(mtl_dir / "grapheme_mtl_merged_expanded_v1.json")
    assert tokenizer.vocab_size == 2454
    assert [tokenizer.token_id(t) for t in ("[STOP]", "[UNK]", "[SPACE]", "[START]")] == [0, 1, 2, 255]
    assert all(tokenizer.token_id(f"[{code}]") is not None for code in SUPPORTED_LANGUAGES)
    assert all(tokenizer.token_id(f"[cj_{c}]") is not None for c in "abcdefghijklmnopqrstuvwxyz0123456789.")


@pytest.mark.parametrize("language", [lang for lang in SUPPORTED_LANGUAGES if lang not in ("he", "ru")])
def test_every_language_tokenizes_without_unknown_tokens(mtl_dir, language):
    tokenizer = MultilingualTokenizer.from_file(
        mtl_dir / "grapheme_mtl_merged_expanded_v1.json", segmenter=lambda text: text.split(" "),
    )
    ids = tokenizer.encode(normalize_punctuation(SAMPLE_SENTENCES[language], "mtl"), language)
    assert tokenizer.unk_id not in ids


def test_cangjie_stand_in_covers_the_chinese_sample(mtl_dir):
    table = {entry.split("\t")[0] for entry in json.loads((mtl_dir / "Cangjie5_TC.json").read_text())}
    hanzi = {c for c in SAMPLE_SENTENCES["zh"] if "\u4e00" <= c <= "\u9fff"}
    assert hanzi <= table


def test_gpt2_vocab_layout(gpt2_dir):
    vocab = json.loads((gpt2_dir / "vocab.json").read_text())
    added = json.loads((gpt2_dir / "added_tokens.json").read_text())
    assert len(vocab) == 50257 and vocab["<|endoftext|>"] == 50256
    assert sorted(vocab.values()) == list(range(50257))
    assert added == {tag: 50257 + n for n, tag in enumerate(PARALINGUISTIC_TAGS)}


def test_gpt2_padding_entries_cannot_be_produced_by_merges(gpt2_dir):
    vocab = json.loads((gpt2_dir / "vocab.json").read_text())
    lines = (gpt2_dir / "merges.txt").read_text().splitlines()[1:]
    producible = {line.replace(" ", "") for line in lines}
    reachable = set(list(vocab)[:256]) | producible | {"<|endoftext|>"}
    unreachable = [token for token in vocab if token not in reachable]
    assert len(unreachable) == 50257 - 256 - len(lines) - 1
    assert all(token.startswith("<|unused_") for token in unreachable)


@pytest.mark.oracle
def test_transformers_loads_the_gpt2_directory_with_50276_tokens(auto_tokenizer, gpt2_dir):
    tokenizer = load_reference_gpt2(auto_tokenizer, gpt2_dir)
    assert len(tokenizer) == 50276
    assert tokenizer.convert_tokens_to_ids(list(PARALINGUISTIC_TAGS)) == list(range(50257, 50276))
