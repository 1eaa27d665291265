"""Stand-in GPT-2 tokenizer files of the Turbo and Nano checkpoints.

``vocab.json`` holds the real byte-level base (256 byte symbols, in GPT-2's order), merges
learned from ``ENGLISH_PROSE``, unreachable ``<|unused_n|>`` padding (no merge produces them) up
to 50256 and ``<|endoftext|>`` = 50256, like GPT-2's 50257 entries. ``added_tokens.json`` adds the
19 paralinguistic tags at 50257..50275, so ``transformers.AutoTokenizer`` loads the directory with
``len(tokenizer) == 50276``.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers.pre_tokenizers import ByteLevel

from chorus.text.gpt2 import GPT2_ENDOFTEXT
from chorus.text.sample_text import ENGLISH_PROSE
from chorus.text.bpe import count_words, learn_bpe_merges

GPT2_BASE_VOCAB_SIZE = 50257  # ids 0..50256, the last being <|endoftext|>
GPT2_MAX_MERGES = 2000

# The Turbo tokenizer's 19 added tokens. The tag set is the one public third-party code reports
# for ResembleAI/chatterbox-turbo's added_tokens.json; the order (hence the exact ids) is not
# verified against the real file. The last nine are the tags Resemble's demo offers.
PARALINGUISTIC_TAGS: tuple[str, ...] = (
    "[angry]", "[fear]", "[surprised]", "[whispering]", "[advertisement]", "[dramatic]",
    "[narration]", "[crying]", "[happy]", "[sarcastic]",
    "[clear throat]", "[sigh]", "[shush]", "[cough]", "[groan]", "[sniff]", "[gasp]", "[chuckle]", "[laugh]",
)
FIRST_TAG_ID = GPT2_BASE_VOCAB_SIZE


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte, in vocabulary order: the bytes that are already
    printable keep their own character, the other 68 map to U+0100 onwards."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols = {byte: chr(byte) for byte in printable}
    shifted = [byte for byte in range(256) if byte not in symbols]
    symbols.update({byte: chr(0x100 + n) for n, byte in enumerate(shifted)})
    return [symbols[byte] for byte in printable + shifted]


def build_gpt2_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab of 50257 entries, merges) of the stand-in byte-level BPE."""
    base = byte_symbols()
    pieces = [piece for piece, _ in ByteLevel(add_prefix_space=False).pre_tokenize_str(ENGLISH_PROSE)]
    merges = learn_bpe_merges(count_words(pieces), max_merges=GPT2_MAX_MERGES)
    tokens = base + [left + right for left, right in merges]
    assert len(set(tokens)) == len(tokens), "a merge result collides with a byte symbol"
    padding = GPT2_BASE_VOCAB_SIZE - 1 - len(tokens)
    tokens += [f"<|unused_{n}|>" for n in range(padding)] + [GPT2_ENDOFTEXT]
    return {token: index for index, token in enumerate(tokens)}, merges


def _token_entry(content: str, *, special: bool, normalized: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": normalized, "rstrip": False,
            "single_word": False, "special": special}


def _dump(path: Path, data) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def write_gpt2_tokenizer(out_dir: Path) -> list[Path]:
    """Write the five GPT-2 tokenizer files into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    vocab, merges = build_gpt2_vocab()
    tag_ids = {tag: FIRST_TAG_ID + n for n, tag in enumerate(PARALINGUISTIC_TAGS)}
    decoder = {str(vocab[GPT2_ENDOFTEXT]): _token_entry(GPT2_ENDOFTEXT, special=True, normalized=True)}
    # Added like ``tokenizer.add_tokens(tags)`` would: plain (non-special) tokens.
    decoder.update({str(i): _token_entry(tag, special=False, normalized=True) for tag, i in tag_ids.items()})
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": GPT2_ENDOFTEXT,
        "clean_up_tokenization_spaces": False,
        "eos_token": GPT2_ENDOFTEXT,
        "errors": "replace",
        "model_max_length": 1024,
        "pad_token": None,
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": GPT2_ENDOFTEXT,
    }
    named = {"content": GPT2_ENDOFTEXT, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
    merges_path = out / "merges.txt"
    merges_path.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return [
        _dump(out / "vocab.json", vocab),
        merges_path,
        _dump(out / "added_tokens.json", tag_ids),
        _dump(out / "tokenizer_config.json", config),
        _dump(out / "special_tokens_map.json", {"bos_token": named, "eos_token": named, "unk_token": named}),
    ]
