"""Tiny random-weight models of every stage for pipeline tests: the real T3, S3Gen, text encoder
and engine code, at sizes that run in milliseconds on the CPU."""
from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from chorus.models.loading import Checkpoint
from chorus.models.random_checkpoint import random_builtin_voice, write_random_checkpoint
from chorus.pipeline.models import SpeechModels
from chorus.text import load_text_encoder
from chorus.voices import Voice
from tests.engine.test_alignment import aligned_tiny
from tests.engine.tiny_models import tiny
from tests.voices.checkpoints import scratch_dir
from tests.vocoder.models import random_s3gen

tiny_s3gen = functools.cache(random_s3gen)


def short_voice(name: str, seed: int = 0) -> Voice:
    """A random voice cut to a 1 s S3Gen prompt (S3Gen's cost grows with the prompt)."""
    variant, _ = tiny(name)
    voice = Voice.from_conditionals(random_builtin_voice(variant, seed), name=f"v{seed}")
    return replace(voice, t3_prompt_tokens=voice.t3_prompt_tokens[:, :40], t3_prompt_embeds=None,
                   s3gen_prompt_tokens=voice.s3gen_prompt_tokens[:, :25],
                   s3gen_prompt_mel=voice.s3gen_prompt_mel[:, :50], name=f"short{seed}")


@functools.cache
def _checkpoint_dir(name: str) -> Path:
    variant, _ = tiny(name)
    directory = Path(scratch_dir(f"chorus-tiny-{name}-"))  # under pytest's temp dir, also in Ray replicas
    write_random_checkpoint(variant, directory, components=("tokenizer", "conds"))
    return directory


def forget_checkpoints() -> None:
    """Forget the cached checkpoint directories (tests/voices/checkpoints.remove_shared removed them)."""
    _checkpoint_dir.cache_clear()


def tiny_models(name: str) -> SpeechModels:
    """SpeechModels of a tiny variant whose built-in voice is :func:`short_voice`."""
    variant, t3 = tiny(name)
    directory = _checkpoint_dir(name)
    models = SpeechModels(Checkpoint(variant, directory), t3, tiny_s3gen(name, seed=0),
                          load_text_encoder(variant, directory))
    models._builtin = short_voice(name)
    return models


@functools.cache
def aligned_models() -> SpeechModels:
    """The original variant with a T3 deep and wide enough to have every alignment head."""
    variant, t3 = aligned_tiny("original")
    directory = Path(scratch_dir("chorus-tiny-aligned-"))
    write_random_checkpoint(variant, directory, components=("tokenizer", "conds"))
    models = SpeechModels(Checkpoint(variant, directory), t3, tiny_s3gen("original", seed=0),
                          load_text_encoder(variant, directory))
    models._builtin = short_voice("original")
    return models
