from __future__ import annotations

import pytest

from chorus.text import EnglishTokenizer, TokenizerFileError, normalize_punctuation
from chorus.text.sample_text import ENGLISH_PROSE
from tests.text.corpus import EDGE_CASES


@pytest.fixture(scope="module")
def tokenizer(en_tokenizer_path):
    return EnglishTokenizer.from_file(en_tokenizer_path)


def test_known_example_ids(tokenizer):
    assert tokenizer.encode("Hello world.") == [284, 18, 84, 28, 2, 179, 79, 9]


def test_special_token_ids(tokenizer):
    assert (tokenizer.start_id, tokenizer.stop_id, tokenizer.space_id, tokenizer.unk_id) == (255, 0, 2, 1)
    assert tokenizer.vocab_size == 704


def test_decode_round_trips_spaces(tokenizer):
    assert tokenizer.decode(tokenizer.encode("Hello world.")) == "Hello world."


@pytest.mark.oracle
def test_ids_match_reference_en_tokenizer(tokenizer, oracle_tokenizers, en_tokenizer_path):
    reference = oracle_tokenizers.EnTokenizer(str(en_tokenizer_path))
    texts = [normalize_punctuation(t, "en") for t in EDGE_CASES + tuple(ENGLISH_PROSE.splitlines())]
    texts += list(EDGE_CASES)  # raw text too: the tokenizer alone must agree on anything
    assert [tokenizer.encode(t) for t in texts] == [reference.encode(t) for t in texts]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerFileError, match="not found"):
        EnglishTokenizer.from_file(tmp_path / "tokenizer.json")


def test_file_without_start_token_is_rejected(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    path = tmp_path / "tokenizer.json"
    Tokenizer(BPE(vocab={"[STOP]": 0, "[UNK]": 1, "[SPACE]": 2}, merges=[], unk_token="[UNK]")).save(str(path))
    with pytest.raises(TokenizerFileError, match=r"\[START\]"):
        EnglishTokenizer.from_file(path)
