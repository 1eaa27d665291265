"""The repetition-penalty set of each row, kept as an [R, V] bool mask.

EN/MTL penalise {BOS} and every generated token on every step. Turbo/Nano penalise {BOS} on the
first step only and the generated tokens afterwards (``SamplingDefaults.penalize_bos_always``).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from chorus.models.variants import Variant


def initial_penalty_mask(variant: Variant, num_rows: int, device: torch.device | str = "cpu") -> Tensor:
    """[num_rows, V] masks of requests that have not generated anything yet: {BOS}."""
    mask = torch.zeros(num_rows, variant.t3.speech_vocab_size, dtype=torch.bool, device=device)
    mask[:, variant.t3.start_speech_token] = True
    return mask


def penalty_mask_from_history(variant: Variant, generated: Sequence[Sequence[int]],
                              device: torch.device | str = "cpu") -> Tensor:
    """[R, V] masks rebuilt from each row's generated tokens (BOS excluded), e.g. after a
    preemption; equal to the masks ``record_sampled_tokens`` would have kept."""
    vocab, bos = variant.t3.speech_vocab_size, variant.t3.start_speech_token
    mask = torch.zeros(len(generated), vocab, dtype=torch.bool)
    for row, tokens in enumerate(generated):
        if variant.sampling.penalize_bos_always or not tokens:
            mask[row, bos] = True
        if tokens:
            mask[row, torch.as_tensor(list(tokens), dtype=torch.int64)] = True
    return mask.to(device)


def record_sampled_tokens(variant: Variant, seen_mask: Tensor, tokens: Tensor, steps: Tensor) -> None:
    """Add each row's new token to its set, in place and without host synchronisation.

    ``tokens``: [R] int64 from the sampler (``NO_TOKEN`` rows are left alone); ``steps``: [R]
    the steps those tokens were drawn at. Turbo/Nano rows at step 0 drop BOS from their set.
    """
    valid = tokens >= 0
    if not variant.sampling.penalize_bos_always:
        seen_mask[:, variant.t3.start_speech_token] &= ~((steps == 0) & valid)
    index = tokens.clamp(min=0)[:, None]
    # Gather-or-scatter so a NO_TOKEN row rewrites its own current value instead of clearing id 0.
    seen_mask.scatter_(1, index, seen_mask.gather(1, index) | valid[:, None])
