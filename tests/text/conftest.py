"""Fixtures of the text front-end tests: stand-in tokenizer directories and oracle pieces."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from chorus.text import write_standin_tokenizer_files
from chorus.text.standin import english_tokenizer_asset
from tests.text.reference import load_reference_gpt2


@pytest.fixture(scope="session")
def en_tokenizer_path() -> Path:
    return english_tokenizer_asset()


@pytest.fixture(scope="session")
def mtl_dir(session_tmp_path_factory) -> Path:
    directory = session_tmp_path_factory.mktemp("mtl_tokenizer")
    write_standin_tokenizer_files("mtl", directory)
    return directory


@pytest.fixture(scope="session")
def gpt2_dir(session_tmp_path_factory) -> Path:
    directory = session_tmp_path_factory.mktemp("gpt2_tokenizer")
    write_standin_tokenizer_files("gpt2", directory)
    return directory


@pytest.fixture(scope="session")
def oracle_tokenizers(oracle):
    """The reference's tokenizer module."""
    from chatterbox.models.tokenizers import tokenizer

    return tokenizer


@pytest.fixture(scope="session")
def oracle_mtl(oracle_tokenizers, mtl_dir):
    """The reference MTLTokenizer on the stand-in vocabulary, its Cangjie table read from the
    stand-in file instead of the hub (it would only warn and skip it offline)."""
    original = oracle_tokenizers.hf_hub_download
    oracle_tokenizers.hf_hub_download = lambda repo_id, filename, **kwargs: os.path.join(mtl_dir, filename)
    try:
        tokenizer = oracle_tokenizers.MTLTokenizer(str(mtl_dir / "grapheme_mtl_merged_expanded_v1.json"))
    finally:
        oracle_tokenizers.hf_hub_download = original
    assert tokenizer.cangjie_converter.word2cj, "the oracle did not read the stand-in Cangjie table"
    return tokenizer


@pytest.fixture(scope="session")
def auto_tokenizer(oracle):
    """transformers' AutoTokenizer (installed with the oracle)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer


@pytest.fixture(scope="session")
def reference_gpt2(auto_tokenizer, gpt2_dir):
    return load_reference_gpt2(auto_tokenizer, gpt2_dir)
