"""Seeded random T3 weights in the official layout, scaled so that every input matters
(unit-gain matrices, unit-scale embeddings, norm scales and biases away from 1 and 0)."""
from __future__ import annotations

import math

import torch

from chorus.models.t3 import T3Model
from chorus.models.variants import T3Config

EMBEDDING_TABLES = ("emb.weight", "text_emb.weight", "speech_emb.weight", "wpe.weight", "wte.weight",
                    "embed_tokens.weight")


def random_t3_state(config: T3Config, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in T3Model.checkpoint_shapes(config).items():
        noise = torch.randn(shape, generator=g)
        if len(shape) == 1:
            is_scale = key.endswith(".weight")  # norm scales; every 1-D ".bias" is a bias
            state[key] = 1.0 + 0.1 * noise if is_scale else 0.05 * noise
        elif key.endswith(EMBEDDING_TABLES) or key.endswith("pre_attention_query"):
            state[key] = noise
        else:
            # GPT-2 Conv1D weights are [in, out]; everything else is [out, in]
            fan_in = shape[0] if key.startswith("tfmr.h.") else shape[-1]
            state[key] = noise / math.sqrt(fan_in)
    return state
