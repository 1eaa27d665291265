"""The byte-level BPE (GPT-2) tokenizer of the Turbo and Nano variants.

The reference loads the checkpoint directory with ``transformers.AutoTokenizer`` and calls it with
``truncation=True``. Chorus rebuilds the same tokenizer from the same files with the ``tokenizers``
library alone, following what transformers 5.x does for a ``GPT2Tokenizer`` directory without a
``tokenizer.json``:

* ``vocab.json`` + ``merges.txt`` -> BPE, byte-level pre-tokenizer (``add_prefix_space`` from the
  config, default off), no normaliser;
* added tokens from ``tokenizer_config.json``'s ``added_tokens_decoder`` when present, otherwise
  from ``added_tokens.json`` (special when named in ``special_tokens_map.json``), added in id order;
* the named special tokens (``<|endoftext|>`` by default) are matched as single tokens;
* no BOS/EOS unless the config sets ``add_bos_token``/``add_eos_token``;
* sequences longer than ``model_max_length`` are cut to it (the reference's ``truncation=True``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from chorus.text.errors import TokenizerFileError

logger = logging.getLogger(__name__)

GPT2_TOKENIZER_FILES = (
    "vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json",
)
GPT2_ENDOFTEXT = "<|endoftext|>"
_NAMED_SPECIAL_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)
_FLAG_KEYS = ("lstrip", "rstrip", "single_word", "normalized")
_LIST_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")
# transformers treats a model_max_length this large as "unlimited"
_UNLIMITED = int(1e20)


@dataclass(frozen=True)
class AddedTokenSpec:
    """One added token as declared by the checkpoint's files."""

    content: str
    token_id: int | None
    special: bool
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = True
    single_word: bool = False

    def to_added_token(self) -> AddedToken:
        return AddedToken(
            self.content, single_word=self.single_word, lstrip=self.lstrip, rstrip=self.rstrip,
            normalized=self.normalized, special=self.special,
        )


def _read_json(path: Path, default: Any = None) -> Any:
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerFileError(f"cannot read {path}: {exc}") from exc


def _token_content(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get("content")
    return str(value)


def _flags(entry: dict[str, Any]) -> dict[str, bool]:
    return {key: bool(entry[key]) for key in _FLAG_KEYS if key in entry}


def _named_spec(value: Any) -> AddedTokenSpec | None:
    content = _token_content(value)
    if not content:
        return None
    flags = _flags(value) if isinstance(value, dict) else {}
    flags.setdefault("normalized", False)
    return AddedTokenSpec(content, None, special=True, **flags)


def _listed_specials(source: dict[str, Any]) -> list[Any]:
    values: list[Any] = []
    for key in _LIST_SPECIAL_KEYS:
        listed = source.get(key) or []
        values.extend(listed.values() if isinstance(listed, dict) else listed)
    return values


def read_added_token_specs(directory: Path) -> tuple[list[AddedTokenSpec], dict[str, Any]]:
    """The added tokens (id-declared first, in id order, then named specials) and the config."""
    config = _read_json(directory / "tokenizer_config.json", {}) or {}
    named_source: dict[str, Any] = dict(config)
    declared: list[AddedTokenSpec] = []
    if "added_tokens_decoder" in config:
        for key, entry in config["added_tokens_decoder"].items():
            entry = dict(entry)
            content = entry.pop("content")
            special = bool(entry.pop("special", False))
            flags = _flags(entry)
            flags.setdefault("normalized", not special)
            declared.append(AddedTokenSpec(content, int(key), special=special, **flags))
    else:
        # Legacy layout: special_tokens_map.json names the specials, added_tokens.json lists ids.
        for key, value in (_read_json(directory / "special_tokens_map.json", {}) or {}).items():
            named_source.setdefault(key, value)
        specials = {_token_content(named_source.get(k)) for k in _NAMED_SPECIAL_KEYS}
        specials.update(_token_content(v) for v in _listed_specials(named_source))
        for content, token_id in (_read_json(directory / "added_tokens.json", {}) or {}).items():
            special = content in specials
            declared.append(AddedTokenSpec(content, int(token_id), special=special, normalized=not special))
    declared.sort(key=lambda spec: spec.token_id)

    named: list[AddedTokenSpec] = []
    defaults = {"bos_token": GPT2_ENDOFTEXT, "eos_token": GPT2_ENDOFTEXT, "unk_token": GPT2_ENDOFTEXT}
    for key in _NAMED_SPECIAL_KEYS:
        spec = _named_spec(named_source.get(key, defaults.get(key)))
        if spec is not None:
            named.append(spec)
    for value in _listed_specials(named_source):
        spec = _named_spec(value)
        if spec is not None:
            named.append(spec)
    known = {spec.content for spec in declared}
    extra = []
    for spec in named:
        if spec.content not in known:
            known.add(spec.content)
            extra.append(spec)
    return declared + extra, config


def _framing_id(tokenizer: Tokenizer, config: dict[str, Any], which: str) -> int | None:
    """Id of the BOS/EOS token when the config asks for it to be added, else None."""
    content = _token_content(config.get(f"{which}_token", GPT2_ENDOFTEXT))
    if not config.get(f"add_{which}_token") or not content:
        return None
    return tokenizer.token_to_id(content)


class Gpt2Tokenizer:
    """Byte-level BPE over a Turbo/Nano checkpoint directory; ``encode`` gives raw T3 text ids."""

    def __init__(self, tokenizer: Tokenizer, *, model_max_length: int | None = None,
                 bos_id: int | None = None, eos_id: int | None = None, source: str = "<memory>"):
        self.tokenizer = tokenizer
        self.model_max_length = model_max_length
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.source = source

    @classmethod
    def from_dir(cls, directory: str | Path) -> "Gpt2Tokenizer":
        """Load ``vocab.json``, ``merges.txt`` and the optional config files from ``directory``."""
        directory = Path(directory)
        missing = [name for name in ("vocab.json", "merges.txt") if not (directory / name).is_file()]
        if missing:
            raise TokenizerFileError(f"the GPT-2 tokenizer in {directory} lacks {', '.join(missing)}")
        try:
            vocab, merges = BPE.read_file(str(directory / "vocab.json"), str(directory / "merges.txt"))
        except Exception as exc:
            raise TokenizerFileError(f"cannot read the GPT-2 vocabulary in {directory}: {exc}") from exc
        specs, config = read_added_token_specs(directory)

        tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                                  end_of_word_suffix="", fuse_unk=False))
        prefix_space = bool(config.get("add_prefix_space", False))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
        tokenizer.decoder = decoders.ByteLevel()
        for spec in specs:
            if spec.special:
                tokenizer.add_special_tokens([spec.to_added_token()])
            else:
                tokenizer.add_tokens([spec.to_added_token()])
            actual = tokenizer.token_to_id(spec.content)
            if spec.token_id is not None and actual != spec.token_id:
                raise TokenizerFileError(
                    f"{directory}: added token {spec.content!r} is declared with id {spec.token_id} but "
                    f"lands on id {actual}; added-token ids must continue the vocabulary without gaps"
                )

        max_length = config.get("model_max_length")
        max_length = int(max_length) if max_length is not None and int(max_length) < _UNLIMITED else None
        return cls(
            tokenizer, model_max_length=max_length, bos_id=_framing_id(tokenizer, config, "bos"),
            eos_id=_framing_id(tokenizer, config, "eos"), source=str(directory),
        )

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Ids of already punctuation-normalised ``text``, cut to ``model_max_length``."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        framing = (self.bos_id is not None) + (self.eos_id is not None)
        if self.model_max_length is not None and len(ids) + framing > self.model_max_length:
            keep = max(self.model_max_length - framing, 0)
            logger.warning(
                "text has %d tokens, more than this tokenizer's model_max_length %d; the reference "
                "truncates, so only the first %d are kept. Split long text with "
                "chorus.text.split_into_chunks.", len(ids) + framing, self.model_max_length, keep,
            )
            ids = ids[:keep]
        if self.bos_id is not None:
            ids = [self.bos_id, *ids]
        if self.eos_id is not None:
            ids = [*ids, self.eos_id]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
