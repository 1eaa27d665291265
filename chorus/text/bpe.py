"""Byte-pair merges learned from word counts: how the stand-in tokenizers (chorus.text.standin_mtl,
chorus.text.standin_gpt2) build their vocabularies from sample text."""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable


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
