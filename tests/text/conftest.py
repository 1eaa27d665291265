"""Fixtures of the text front-end tests: stand-in tokenizer directories and oracle pieces."""
from __future__ import annotations

import importlib.util
import os
import shutil
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


@pytest.fixture(scope="session", autouse=True)
def pkuseg_home(session_tmp_path_factory):
    """Where spacy-pkuseg keeps its default model, holding a tiny trained one, when spacy-pkuseg
    is installed: the reference calls ``pkuseg()``, which would otherwise download the real model
    (and fail offline), and Chorus's lenient default finds the same model there. None otherwise."""
    if importlib.util.find_spec("spacy_pkuseg") is None:
        yield None
        return
    import spacy_pkuseg.config

    from tests.text.tiny_language_models import install_as_pkuseg_default, train_tiny_pkuseg

    home = session_tmp_path_factory.mktemp("pkuseg_home")
    install_as_pkuseg_default(train_tiny_pkuseg(session_tmp_path_factory.mktemp("pkuseg_train")), home)
    saved_env, saved_home = os.environ.get("PKUSEG_HOME"), spacy_pkuseg.config.pkuseg_home
    os.environ["PKUSEG_HOME"] = str(home)
    spacy_pkuseg.config.pkuseg_home = str(home)  # read by spacy-pkuseg at import
    yield home
    # spacy-pkuseg makes a temp dir of its own at import (config.homepath: its trainer writes
    # there) and never removes it
    shutil.rmtree(spacy_pkuseg.config.homepath, ignore_errors=True)
    spacy_pkuseg.config.pkuseg_home = saved_home
    if saved_env is None:
        os.environ.pop("PKUSEG_HOME", None)
    else:
        os.environ["PKUSEG_HOME"] = saved_env


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
