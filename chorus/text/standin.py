"""Stand-in tokenizer files for random-weight checkpoints.

The real multilingual and GPT-2 tokenizer files are not available offline, so tests and
benchmarks use generated files with the official names, formats, sizes and special tokens
(see docs/text.md). The English ``tokenizer.json`` is the real one (it ships with Chorus).
Output is deterministic: the same call writes byte-identical files.
"""
from __future__ import annotations

import heapq
import shutil
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path
from typing import Iterable, Literal

TokenizerKind = Literal["en", "mtl", "gpt2"]


def english_tokenizer_asset() -> Path:
    """Path of the real English ``tokenizer.json`` bundled with Chorus."""
    return Path(str(resources.files("chorus") / "assets" / "en_tokenizer.json"))


def learn_bpe_merges(
    word_counts: dict[tuple[str, ...], int], max_merges: int, min_count: int = 2,
) -> list[tuple[str, str]]:
    """Classic BPE: repeatedly merge the most frequent adjacent pair (ties: smallest pair first).

    ``word_counts`` maps words, already split into base symbols, to their frequency.
    """
    words = [list(word) for word in word_counts]
    counts = list(word_counts.values())
    pair_counts: Counter[tuple[str, str]] = Counter()
    pair_words: dict[tuple[str, str], set[int]] = defaultdict(set)
    for index, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += counts[index]
            pair_words[pair].add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < max_merges:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative:
            continue  # stale entry
        if -negative < min_count:
            break
        merges.append(pair)
        merged = pair[0] + pair[1]
        changed: set[tuple[str, str]] = set()
        for index in sorted(pair_words.pop(pair, ())):
            word = words[index]
            for old in zip(word, word[1:]):
                pair_counts[old] -= counts[index]
                changed.add(old)
            new_word, position = [], 0
            while position < len(word):
                if position + 1 < len(word) and (word[position], word[position + 1]) == pair:
                    new_word.append(merged)
                    position += 2
                else:
                    new_word.append(word[position])
                    position += 1
            words[index] = new_word
            for new in zip(new_word, new_word[1:]):
                pair_counts[new] += counts[index]
                pair_words[new].add(index)
                changed.add(new)
        pair_counts.pop(pair, None)
        for other in changed:
            if pair_counts.get(other, 0) > 0:
                heapq.heappush(heap, (-pair_counts[other], other))
    return merges


def count_words(pieces: Iterable[str]) -> dict[tuple[str, ...], int]:
    """Word -> frequency, words as character tuples, in first-seen order (for determinism)."""
    counter: Counter[str] = Counter(pieces)
    return {tuple(word): count for word, count in counter.items()}


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
