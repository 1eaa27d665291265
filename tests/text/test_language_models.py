"""The language steps' model files: where they come from, what a missing one does in lenient and
strict mode, and the real dicta-onnx / spacy-pkuseg packages running on tiny models built here."""
from __future__ import annotations

import io
import logging
import unicodedata

import pytest

from chorus.text import (
    LanguageModelMissingError,
    LanguageStepConfig,
    MultilingualTokenizer,
    load_text_encoder,
    write_standin_tokenizer_files,
)
from chorus.text import language_models, language_steps
from chorus.text.language_models import DICTA_MODEL_FILE, resolve_dicta_model, resolve_pkuseg_model
from tests.text.tiny_language_models import diacritized, write_dicta_tokenizer, write_tiny_dicta_onnx

HEBREW = "שלום עולם"


@pytest.fixture
def no_cached_models(tmp_path, monkeypatch):
    """Empty Chorus and pkuseg caches, downloads off, and the once-per-process warnings unsaid."""
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path / "chorus-cache"))
    monkeypatch.setenv("PKUSEG_HOME", str(tmp_path / "pkuseg-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(language_steps, "_warned", set())


@pytest.fixture
def mtl_ckpt(tmp_path):
    directory = tmp_path / "mtl"
    directory.mkdir()
    write_standin_tokenizer_files("mtl", directory)
    return directory


@pytest.fixture
def dicta(tmp_path, monkeypatch):
    """dicta-onnx installed, a tiny ONNX model with Dicta's inputs and outputs, and a tokenizer in
    the Hugging Face cache where dicta-onnx reads it."""
    pytest.importorskip("dicta_onnx")
    pytest.importorskip("onnx")
    from huggingface_hub import constants

    write_dicta_tokenizer(tmp_path / "hf")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))  # read at import otherwise
    return write_tiny_dicta_onnx(tmp_path / "tiny-dicta.onnx")


def _tokenizer(mtl_ckpt, **config) -> MultilingualTokenizer:
    steps = LanguageStepConfig(**config)
    return load_text_encoder("multilingual", mtl_ckpt, language_steps=steps).tokenizer


# -- Hebrew ---------------------------------------------------------------------------------------

def test_hebrew_gets_diacritics_from_the_configured_dicta_model(no_cached_models, dicta, mtl_ckpt):
    tokenizer = _tokenizer(mtl_ckpt, dicta_model=dicta)
    assert tokenizer.prepare_text(HEBREW, "he") == "[he]" + diacritized(HEBREW)


def test_strict_mode_loads_the_dicta_model_at_start_up(no_cached_models, dicta, mtl_ckpt, monkeypatch):
    from chorus.text import encoder

    monkeypatch.setattr(encoder, "LANGUAGES_NEEDING_OPTIONAL_PACKAGES", ("he",))  # zh, ja: tested elsewhere
    tokenizer = _tokenizer(mtl_ckpt, strict=True, dicta_model=dicta)
    assert tokenizer.preprocessor.hebrew_diacritizer is not None


def test_lenient_hebrew_without_model_is_plain_text(no_cached_models, mtl_ckpt):
    tokenizer = _tokenizer(mtl_ckpt)
    assert tokenizer.prepare_text(HEBREW, "he") == "[he]" + unicodedata.normalize("NFKD", HEBREW)


def test_lenient_warns_once_per_process_naming_file_and_option(no_cached_models, mtl_ckpt, caplog):
    pytest.importorskip("dicta_onnx")
    with caplog.at_level(logging.WARNING, logger="chorus.text.language_steps"):
        for _ in range(2):  # two encoders, as two pipelines of one process would have
            _tokenizer(mtl_ckpt).prepare_text(HEBREW, "he")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert DICTA_MODEL_FILE in warnings[0] and "--dicta-model" in warnings[0]


def test_strict_without_dicta_model_refuses_at_load_naming_file_option_and_extra(no_cached_models, mtl_ckpt):
    pytest.importorskip("dicta_onnx")
    with pytest.raises(LanguageModelMissingError) as caught:
        _tokenizer(mtl_ckpt, strict=True)
    message = str(caught.value)
    for needed in (DICTA_MODEL_FILE, "--dicta-model", "CHORUS_DICTA_MODEL", "chorus-tts[he]", "HF_HUB_OFFLINE"):
        assert needed in message


def test_configured_dicta_model_that_does_not_exist_is_named(no_cached_models, tmp_path):
    missing = tmp_path / "nowhere" / "dicta.onnx"
    with pytest.raises(LanguageModelMissingError, match=str(missing)):
        resolve_dicta_model(LanguageStepConfig(dicta_model=missing))


def test_dicta_model_env_var_is_read(monkeypatch, tmp_path):
    monkeypatch.setenv("CHORUS_DICTA_MODEL", str(tmp_path / "d.onnx"))
    assert LanguageStepConfig.from_options().dicta_model == tmp_path / "d.onnx"


def test_option_wins_over_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv("CHORUS_PKUSEG_MODEL", str(tmp_path / "env"))
    assert LanguageStepConfig.from_options(pkuseg_model=tmp_path / "flag").pkuseg_model == tmp_path / "flag"


def test_offline_never_downloads_the_dicta_model(no_cached_models, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a download was attempted with HF_HUB_OFFLINE set")

    monkeypatch.setattr(language_models.urllib.request, "urlopen", no_network)
    with pytest.raises(LanguageModelMissingError, match="HF_HUB_OFFLINE is set"):
        resolve_dicta_model(LanguageStepConfig())


def test_allowed_download_is_cached_and_done_once(no_cached_models, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []

    def fake_release(url, timeout):
        calls.append(url)
        return io.BytesIO(b"onnx bytes")

    monkeypatch.setattr(language_models.urllib.request, "urlopen", fake_release)
    first = resolve_dicta_model(LanguageStepConfig())
    second = resolve_dicta_model(LanguageStepConfig())
    assert first == second == tmp_path / "chorus-cache" / "dicta-onnx" / DICTA_MODEL_FILE
    assert first.read_bytes() == b"onnx bytes"
    assert calls == [language_models.DICTA_MODEL_URL]


# -- Chinese --------------------------------------------------------------------------------------

def test_chinese_segments_with_the_configured_pkuseg_directory(no_cached_models, mtl_ckpt, tmp_path):
    spacy_pkuseg = pytest.importorskip("spacy_pkuseg")
    from tests.text.tiny_language_models import train_tiny_pkuseg

    model = train_tiny_pkuseg(tmp_path / "train")
    tokenizer = _tokenizer(mtl_ckpt, pkuseg_model=model)
    text = "今天天气很好"
    words = spacy_pkuseg.pkuseg(model_name=str(model)).cut(text)
    tokenizer.preprocessor.prepare("zh")
    assert tokenizer.preprocessor.segmenter(text) == words
    assert len(words) > 1


def test_pkuseg_default_model_is_found_in_its_cache(no_cached_models, tmp_path):
    home = tmp_path / "pkuseg-home" / "spacy_ontonotes"
    home.mkdir(parents=True)
    for name in ("features.msgpack", "weights.npz"):
        (home / name).write_bytes(b"")
    assert resolve_pkuseg_model(LanguageStepConfig()) == str(home)


def test_pkuseg_default_model_is_left_to_spacy_pkuseg_to_download_when_allowed(no_cached_models, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert resolve_pkuseg_model(LanguageStepConfig()) == "spacy_ontonotes"


def test_strict_without_pkuseg_model_names_directory_option_and_extra(no_cached_models):
    with pytest.raises(LanguageModelMissingError) as caught:
        resolve_pkuseg_model(LanguageStepConfig(strict=True))
    message = str(caught.value)
    for needed in ("spacy_ontonotes", "--pkuseg-model", "CHORUS_PKUSEG_MODEL", "chorus-tts[zh]"):
        assert needed in message


def test_configured_pkuseg_directory_without_model_files_is_named(no_cached_models, tmp_path):
    with pytest.raises(LanguageModelMissingError, match=str(tmp_path)):
        resolve_pkuseg_model(LanguageStepConfig(pkuseg_model=tmp_path))


def test_synth_and_tokenize_options_build_the_language_step_config(tmp_path):
    from chorus.cli import build_parser
    from chorus.cli.options import language_step_config

    for command in (["tokenize", "hi"], ["synth", "hi", "--out", "x.wav"]):
        args = build_parser().parse_args([*command, "--language-steps", "strict", "--dicta-model", "d.onnx",
                                          "--pkuseg-model", str(tmp_path)])
        steps = language_step_config(args)
        assert (steps.strict, steps.dicta_model, steps.pkuseg_model) == (True, language_models.Path("d.onnx"), tmp_path)
