from __future__ import annotations

import json
import shutil

import pytest

from chorus.models.variants import get_variant
from chorus.text import (
    LanguageModelMissingError,
    LanguageStepConfig,
    MissingLanguagePackageError,
    TextInputError,
    TokenizerFileError,
    UnsupportedLanguageError,
    load_text_encoder,
    normalize_punctuation,
    write_standin_tokenizer_files,
)


@pytest.fixture(scope="module")
def checkpoint_dirs(module_tmp_path_factory):
    dirs = {}
    for kind in ("en", "mtl", "gpt2"):
        dirs[kind] = module_tmp_path_factory.mktemp(f"ckpt_{kind}")
        write_standin_tokenizer_files(kind, dirs[kind])
    return dirs


@pytest.fixture(scope="module")
def original(checkpoint_dirs):
    return load_text_encoder("original", checkpoint_dirs["en"])


@pytest.fixture(scope="module")
def multilingual(checkpoint_dirs):
    return load_text_encoder(get_variant("multilingual"), checkpoint_dirs["mtl"])


@pytest.fixture(scope="module")
def turbo(checkpoint_dirs):
    return load_text_encoder("turbo", checkpoint_dirs["gpt2"])


def test_original_frames_ids_with_start_and_stop(original):
    assert original.encode_framed("hello world") == [255, 284, 18, 84, 28, 2, 179, 79, 9, 0]


def test_encode_leaves_framing_to_the_model(original):
    assert original.encode("hello world") == [284, 18, 84, 28, 2, 179, 79, 9]


def test_multilingual_frames_ids_and_tags_the_language(multilingual):
    ids = multilingual.encode_framed("Bonjour", language="fr")
    tag = multilingual.tokenizer.token_id("[fr]")
    assert ids[:2] == [255, tag] and ids[-1] == 0
    assert multilingual.encode("Bonjour", language="fr") == ids[1:-1]


def test_turbo_returns_raw_ids_without_framing(turbo):
    ids = turbo.encode("Hello there [chuckle]")
    assert ids == turbo.tokenizer.encode(normalize_punctuation("Hello there [chuckle]", "turbo"))


def test_turbo_keeps_paralinguistic_tags_as_single_tokens(turbo):
    chuckle = turbo.tokenizer.token_id("[chuckle]")
    assert turbo.encode("Hello there [chuckle]").count(chuckle) == 1


def test_nano_uses_the_same_gpt2_front_end(checkpoint_dirs, turbo):
    nano = load_text_encoder("nano", checkpoint_dirs["gpt2"])
    assert nano.encode("Hi.") == turbo.encode("Hi.")


@pytest.mark.parametrize("bad", [None, 3, b"bytes", ["list"]])
def test_non_string_text_is_rejected(original, bad):
    with pytest.raises(TextInputError, match="string"):
        original.encode(bad)


@pytest.mark.parametrize("empty", ["", "   ", "\n\t"])
def test_empty_text_is_rejected(turbo, empty):
    with pytest.raises(TextInputError, match="empty"):
        turbo.encode(empty)


def test_multilingual_requires_a_language(multilingual):
    with pytest.raises(UnsupportedLanguageError, match="required.*ar, da"):
        multilingual.encode("Hello")


def test_multilingual_rejects_an_unknown_language(multilingual):
    with pytest.raises(UnsupportedLanguageError, match="'klingon'.*zh"):
        multilingual.encode("Hello", language="klingon")


def test_multilingual_rejects_a_non_string_language(multilingual):
    with pytest.raises(UnsupportedLanguageError, match="string"):
        multilingual.encode("Hello", language=7)


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_english_only_variants_accept_english(request, name):
    encoder = request.getfixturevalue(name)
    assert encoder.encode("Hi.", language="EN") == encoder.encode("Hi.")


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_english_only_variants_reject_other_languages(request, name):
    encoder = request.getfixturevalue(name)
    with pytest.raises(UnsupportedLanguageError, match="English only.*multilingual"):
        encoder.encode("Bonjour.", language="fr")


def test_strict_encoder_refuses_to_load_without_hebrew_model(checkpoint_dirs, monkeypatch, tmp_path):
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path))  # no cached Dicta model
    strict = LanguageStepConfig(strict=True)
    with pytest.raises((MissingLanguagePackageError, LanguageModelMissingError), match=r"chorus-tts\[he\]"):
        load_text_encoder("multilingual", checkpoint_dirs["mtl"], language_steps=strict)


def test_default_encoder_is_lenient_and_speaks_hebrew_plain(multilingual, monkeypatch, tmp_path):
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path))
    ids = multilingual.encode("שלום", language="he")
    assert ids[0] == multilingual.tokenizer.token_id("[he]")


def test_wrong_tokenizer_for_the_variant_is_rejected(checkpoint_dirs, tmp_path):
    # the multilingual vocabulary (2454) is larger than the original model's 704 embeddings
    shutil.copyfile(checkpoint_dirs["mtl"] / "grapheme_mtl_merged_expanded_v1.json", tmp_path / "tokenizer.json")
    with pytest.raises(TokenizerFileError, match="2454 tokens.*704"):
        load_text_encoder("original", tmp_path)


def test_missing_checkpoint_directory_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerFileError, match="not found"):
        load_text_encoder("original", tmp_path / "nowhere")


def test_missing_tokenizer_file_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerFileError, match="grapheme_mtl_merged_expanded_v1.json"):
        load_text_encoder("multilingual-v3", tmp_path)


def test_gpt2_tokenizer_smaller_than_the_model_only_warns(checkpoint_dirs, tmp_path, caplog):
    directory = tmp_path / "gpt2"
    shutil.copytree(checkpoint_dirs["gpt2"], directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["added_tokens_decoder"] = {"50256": config["added_tokens_decoder"]["50256"]}
    config_path.write_text(json.dumps(config))
    encoder = load_text_encoder("turbo", directory)
    assert len(encoder.tokenizer) == 50257
    assert "expects 50276" in caplog.text
