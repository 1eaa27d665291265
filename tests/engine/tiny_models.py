"""Tiny random-weight T3 models and voices for engine tests (the real loading code runs)."""
from __future__ import annotations

import functools

import torch

from chorus.engine.engine import Conditioning
from chorus.models.random_checkpoint import random_builtin_voice, random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import Variant, tiny_variant
from chorus.voices import Voice


@functools.cache
def tiny(name: str, seed: int = 0) -> tuple[Variant, T3Model]:
    variant = tiny_variant(name, layers=2, hidden=64, heads=4)
    state = random_state_dict(t3_key_specs(variant), seed)
    # sharper logits than the default init, so sampling is far from uniform and EOS can occur
    state["speech_head.weight"] = state["speech_head.weight"] * 8
    model = T3Model.from_state_dict(variant.t3, state, dtype=torch.float32, device="cpu", source="random")
    return variant, model


def voice(variant: Variant, seed: int) -> Voice:
    return Voice.from_conditionals(random_builtin_voice(variant, seed), name=f"v{seed}")


def conditioning(variant: Variant, model: T3Model, voice: Voice, exaggeration: float = 0.5) -> Conditioning:
    """The conditioning prefix of ``voice`` as the pipeline builds it."""
    from chorus.pipeline.conditioning import ConditioningCache

    return ConditioningCache(model, variant).get(voice, exaggeration)
