"""Helpers that run the reference (test-only oracle) the way its entry classes do."""
from __future__ import annotations

from pathlib import Path


def load_reference_gpt2(auto_tokenizer, directory: Path):
    """The tokenizer exactly as the reference Turbo entry class sets it up."""
    tokenizer = auto_tokenizer.from_pretrained(str(directory))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def reference_gpt2_ids(tokenizer, text: str) -> list[int]:
    """Ids the reference Turbo entry class computes for already-normalised ``text``."""
    return tokenizer(text, return_tensors="pt", padding=True, truncation=True).input_ids[0].tolist()
