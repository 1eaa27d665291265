from __future__ import annotations

import json
import shutil

import pytest

from chorus.text import PARALINGUISTIC_TAGS, Gpt2Tokenizer, TokenizerFileError, normalize_punctuation
from chorus.text.sample_text import ENGLISH_PROSE
from tests.text.corpus import EDGE_CASES
from tests.text.reference import load_reference_gpt2, reference_gpt2_ids

TAGGED = (
    "Hi there, Sarah here from MochaFone calling you back [chuckle], have you got one minute?",
    "[clear throat] Listen up! [sniff] ugh! Did you just [groan] soil yourself? [cough] Well, [sigh] fine. [laugh]",
    "[whispering] It's a secret.[gasp][shush] [angry][fear][surprised][advertisement][dramatic][narration]",
    "[crying] [happy] [sarcastic] Oh, great.",
    "Not tags: [Laugh] [clear  throat] [laughing] [laugh",
    "Special text <|endoftext|> in the middle",
)


def _texts() -> list[str]:
    raw = list(EDGE_CASES) + list(TAGGED) + ENGLISH_PROSE.splitlines()
    return raw + [normalize_punctuation(t, "turbo") for t in raw]


@pytest.fixture(scope="module")
def tokenizer(gpt2_dir):
    return Gpt2Tokenizer.from_dir(gpt2_dir)


def test_size_is_50276(tokenizer):
    assert len(tokenizer) == 50276


def test_tags_are_single_tokens_at_50257_onwards(tokenizer):
    ids = [tokenizer.encode(tag) for tag in PARALINGUISTIC_TAGS]
    assert ids == [[50257 + n] for n in range(19)]


def test_no_bos_or_eos_is_added(tokenizer):
    assert 50256 not in tokenizer.encode("Hello world.")


@pytest.mark.oracle
def test_ids_match_transformers_auto_tokenizer(tokenizer, reference_gpt2):
    texts = _texts()
    assert [tokenizer.encode(t) for t in texts] == [reference_gpt2_ids(reference_gpt2, t) for t in texts]


@pytest.mark.oracle
def test_truncation_matches_reference(tokenizer, reference_gpt2):
    long_text = ENGLISH_PROSE * 4
    ours = tokenizer.encode(long_text)
    assert len(ours) == 1024
    assert ours == reference_gpt2_ids(reference_gpt2, long_text)


def _variant_dir(tmp_path, gpt2_dir, edit_config=None, drop=()):
    directory = tmp_path / "gpt2"
    shutil.copytree(gpt2_dir, directory)
    for name in drop:
        (directory / name).unlink()
    if edit_config is not None:
        path = directory / "tokenizer_config.json"
        config = json.loads(path.read_text())
        edit_config(config)
        path.write_text(json.dumps(config))
    return directory


@pytest.mark.oracle
def test_legacy_layout_without_added_tokens_decoder_matches_reference(tmp_path, gpt2_dir, auto_tokenizer):
    directory = _variant_dir(tmp_path, gpt2_dir, lambda c: c.pop("added_tokens_decoder"))
    ours = Gpt2Tokenizer.from_dir(directory)
    reference = load_reference_gpt2(auto_tokenizer, directory)
    assert len(ours) == len(reference) == 50276
    texts = list(TAGGED) + [" spaced [laugh] tag "]
    assert [ours.encode(t) for t in texts] == [reference_gpt2_ids(reference, t) for t in texts]


@pytest.mark.oracle
def test_special_stripping_tags_and_bos_config_match_reference(tmp_path, gpt2_dir, auto_tokenizer):
    def edit(config):
        config["add_bos_token"] = True
        config["add_prefix_space"] = True
        for entry in config["added_tokens_decoder"].values():
            if entry["content"] != "<|endoftext|>":
                entry.update(special=True, normalized=False, lstrip=True, rstrip=True)

    directory = _variant_dir(tmp_path, gpt2_dir, edit)
    ours = Gpt2Tokenizer.from_dir(directory)
    reference = load_reference_gpt2(auto_tokenizer, directory)
    texts = list(TAGGED) + ["Hello world.", " spaced [laugh] tag "]
    assert [ours.encode(t) for t in texts] == [reference_gpt2_ids(reference, t) for t in texts]


def test_added_token_with_a_gap_in_ids_is_rejected(tmp_path, gpt2_dir):
    def edit(config):
        entry = config["added_tokens_decoder"].pop("50275")
        config["added_tokens_decoder"]["50300"] = entry

    with pytest.raises(TokenizerFileError, match="50300"):
        Gpt2Tokenizer.from_dir(_variant_dir(tmp_path, gpt2_dir, edit))


def test_missing_vocab_is_a_clear_error(tmp_path, gpt2_dir):
    with pytest.raises(TokenizerFileError, match="vocab.json"):
        Gpt2Tokenizer.from_dir(_variant_dir(tmp_path, gpt2_dir, drop=("vocab.json",)))


def test_unlimited_model_max_length_does_not_truncate(tmp_path, gpt2_dir):
    ours = Gpt2Tokenizer.from_dir(_variant_dir(tmp_path, gpt2_dir, lambda c: c.pop("model_max_length")))
    assert len(ours.encode(ENGLISH_PROSE * 4)) > 1024
