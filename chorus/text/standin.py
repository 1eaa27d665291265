"""Stand-in tokenizer files for random-weight checkpoints.

The real multilingual and GPT-2 tokenizer files are not available offline, so tests and
benchmarks use generated files with the official names, formats, sizes and special tokens
(see docs/text.md). The English ``tokenizer.json`` is the real one (it ships with Chorus).
Output is deterministic: the same call writes byte-identical files.
"""
from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import Literal

TokenizerKind = Literal["en", "mtl", "gpt2"]


def english_tokenizer_asset() -> Path:
    """Path of the real English ``tokenizer.json`` bundled with Chorus."""
    return Path(str(resources.files("chorus") / "assets" / "en_tokenizer.json"))


def write_standin_tokenizer_files(
    kind: TokenizerKind, out_dir: str | Path, *, include_cangjie: bool = True,
) -> list[Path]:
    """Write the tokenizer files of a ``Variant.tokenizer_kind`` under their official names.

    * ``"en"``: the real ``tokenizer.json``;
    * ``"mtl"``: ``grapheme_mtl_merged_expanded_v1.json`` (2454 entries) and, unless
      ``include_cangjie=False``, a small ``Cangjie5_TC.json``;
    * ``"gpt2"``: ``vocab.json`` (50257), ``merges.txt``, ``added_tokens.json`` (19 tags),
      ``tokenizer_config.json``, ``special_tokens_map.json``: 50276 tokens in all.

    Returns the written paths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if kind == "en":
        target = out / "tokenizer.json"
        shutil.copyfile(english_tokenizer_asset(), target)
        return [target]
    if kind == "mtl":
        from chorus.text.standin_mtl import write_cangjie_table, write_grapheme_tokenizer

        paths = [write_grapheme_tokenizer(out)]
        if include_cangjie:
            paths.append(write_cangjie_table(out))
        return paths
    if kind == "gpt2":
        from chorus.text.standin_gpt2 import write_gpt2_tokenizer

        return write_gpt2_tokenizer(out)
    raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of: en, mtl, gpt2")
