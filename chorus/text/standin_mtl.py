"""Stand-in ``grapheme_mtl_merged_expanded_v1.json`` and ``Cangjie5_TC.json``.

The vocabulary has the real file's size (2454) and the special tokens the reference relies on
(``[STOP]``=0, ``[UNK]``=1, ``[SPACE]``=2, ``[START]``=255, one ``[xx]`` tag per language, the
``[cj_*]`` Cangjie letters), the letters and marks of all 23 languages' scripts after lower-casing
and NFKD, merges learned from ``SAMPLE_SENTENCES``, and ``[PLACEHOLDERn]`` padding. Ids other
than those four special tokens are not the real file's.
"""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from tokenizers.pre_tokenizers import Whitespace

from chorus.text.grapheme import SPACE_TOKEN, START_TOKEN, STOP_TOKEN, UNK_TOKEN
from chorus.text.language_steps import CANGJIE_FILE
from chorus.text.languages import SUPPORTED_LANGUAGES
from chorus.text.sample_text import SAMPLE_SENTENCES
from chorus.text.bpe import count_words, learn_bpe_merges

MTL_TOKENIZER_FILE = "grapheme_mtl_merged_expanded_v1.json"
MTL_VOCAB_SIZE = 2454
START_ID = 255

# Cangjie codes use the letters a-z; a glyph's rank among same-code glyphs adds digits.
CANGJIE_TOKENS = tuple(f"[cj_{c}]" for c in "abcdefghijklmnopqrstuvwxyz0123456789.")

_SCRIPT_RANGES = (
    (0x21, 0x7E),  # ASCII
    (0xA1, 0xFF),  # Latin-1 punctuation and letters
    (0x100, 0x17F),  # Latin Extended-A (ł, ı, œ ...)
    (0x300, 0x36F),  # combining diacritics (NFKD splits accented letters into these)
    (0x370, 0x3FF),  # Greek
    (0x400, 0x45F),  # Cyrillic
    (0x591, 0x5F4),  # Hebrew letters and points
    (0x600, 0x6FF),  # Arabic
    (0x900, 0x97F),  # Devanagari
    (0x1100, 0x1112), (0x1161, 0x1175), (0x11A8, 0x11C2),  # Hangul conjoining jamo
    (0x2010, 0x2027), (0x2030, 0x203A), (0x20AC, 0x20AC),  # dashes, quotes, bullets, per mille, euro
    (0x3001, 0x303F),  # CJK punctuation (、。「」...)
    (0x3041, 0x309F), (0x30A0, 0x30FF),  # hiragana, katakana (incl. combining voicing marks)
)

# Real Cangjie 5 codes of common glyphs, as far as we know them; 曰 shares 日's code to
# exercise the rank suffix. A stand-in only: the checkpoint's table is authoritative.
_CANGJIE_ENTRIES = (
    "日\ta", "曰\ta", "月\tb", "金\tc", "木\td", "水\te", "火\tf", "土\tg", "竹\th", "戈\ti", "十\tj",
    "大\tk", "中\tl", "一\tm", "弓\tn", "人\to", "心\tp", "手\tq", "口\tr", "尸\ts", "廿\tt", "山\tu",
    "女\tv", "田\tw", "卜\ty", "今\toin", "天\tmk", "气\tomn", "很\thoav", "好\tvnd", "我\thqi",
    "们\toan", "起\tgorus", "去\tgi", "公\tci", "园\twmmu", "你\tonf", "最\tasje", "近\tyhml",
    "怎\thsp", "么\tii", "样\tdtgq", "是\tamyo", "国\twmgi", "的\thapi", "不\tmf", "了\tnn",
    "在\tklg", "有\tkb", "这\tyyk", "个\toll", "上\tym", "来\tdt", "说\tyrcru", "时\tadi",
    "生\thqm", "会\toimi", "年\toq", "到\tmgln", "就\tyfike", "小\tnc", "多\tnini",
)


def _prepared_samples() -> list[str]:
    return [unicodedata.normalize("NFKD", text.lower()) for text in SAMPLE_SENTENCES.values()]


def _base_characters(samples: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for first, last in _SCRIPT_RANGES:
        for point in range(first, last + 1):
            seen.setdefault(chr(point), None)
    for text in samples:  # anything else the samples use (e.g. hanzi)
        for char in text:
            if not char.isspace():
                seen.setdefault(char, None)
    return list(seen)


def build_grapheme_vocab() -> tuple[dict[str, int], list[tuple[str, str]], list[str]]:
    """(vocab, merges, added-token contents) of the stand-in multilingual tokenizer."""
    samples = _prepared_samples()
    characters = _base_characters(samples)
    special_head = [STOP_TOKEN, UNK_TOKEN, SPACE_TOKEN]
    tags = [f"[{code}]" for code in SUPPORTED_LANGUAGES] + list(CANGJIE_TOKENS)
    before_start = START_ID - len(special_head)
    tokens = special_head + characters[:before_start] + [START_TOKEN] + tags + characters[before_start:]

    pre_tokenizer = Whitespace()
    pieces = [piece for text in samples for piece, _ in pre_tokenizer.pre_tokenize_str(text)]
    budget = MTL_VOCAB_SIZE - len(tokens)
    known = set(tokens)
    merges = []
    for left, right in learn_bpe_merges(count_words(pieces), max_merges=budget):
        if left + right not in known:
            merges.append((left, right))
            known.add(left + right)
            tokens.append(left + right)
    placeholders = [f"[PLACEHOLDER{n}]" for n in range(MTL_VOCAB_SIZE - len(tokens))]
    tokens += placeholders
    assert len(tokens) == MTL_VOCAB_SIZE and tokens[START_ID] == START_TOKEN
    added = [STOP_TOKEN, UNK_TOKEN, SPACE_TOKEN, START_TOKEN, *tags, *placeholders]
    return {token: index for index, token in enumerate(tokens)}, merges, added


def write_grapheme_tokenizer(out_dir: Path) -> Path:
    """Write the stand-in ``grapheme_mtl_merged_expanded_v1.json`` into ``out_dir``."""
    vocab, merges, added = build_grapheme_vocab()
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": vocab[content], "content": content, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for content in added
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": UNK_TOKEN, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{left} {right}" for left, right in merges],
        },
    }
    path = Path(out_dir) / MTL_TOKENIZER_FILE
    path.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path


def write_cangjie_table(out_dir: Path) -> Path:
    """Write a small stand-in ``Cangjie5_TC.json`` (a JSON list of ``"glyph<TAB>code"``)."""
    path = Path(out_dir) / CANGJIE_FILE
    path.write_text(json.dumps(list(_CANGJIE_ENTRIES), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path
