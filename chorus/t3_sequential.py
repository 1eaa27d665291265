"""Plain, exact T3 generation of one request at a time.

This is the reference path of Chorus: one request, a contiguous KV cache, the variant's
sampling order, the counter-based sampler. The batched engine must produce the same tokens
for the same request and seed; tests compare the two.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch

from chorus.models.t3.model import T3Model
from chorus.models.t3.runner import T3SingleSequence
from chorus.models.variants import Variant
from chorus.sampling import (
    NO_TOKEN, SamplingBatch, SamplingParams, initial_penalty_mask, process_logits, record_sampled_tokens,
    sample_next_tokens,
)

FinishReason = Literal["eos", "length", "exhausted"]


@dataclass(frozen=True)
class SpeechTokens:
    """T3 output of one request: generated speech tokens (EOS not included) and why it stopped."""

    tokens: list[int]
    finish_reason: FinishReason
    prompt_length: int


def uses_cfg(variant: Variant, params: SamplingParams) -> bool:
    """Whether a request runs the unconditional CFG row. With ``cfg_weight == 0`` the combine is
    a no-op, so the row is skipped (the English reference crashes there instead)."""
    return variant.t3.supports_cfg and params.cfg_weight > 0


@torch.inference_mode()
def generate_speech_tokens(
    model: T3Model, variant: Variant, cond_embeds: torch.Tensor, text_ids: torch.Tensor,
    params: SamplingParams, *, on_token: Callable[[int], None] | None = None,
) -> SpeechTokens:
    """Generate speech tokens for one request.

    cond_embeds: [1, C, D] from ``model.encode_conditioning``; text_ids: tokenizer output [Lt]
    (unframed); params: validated ``SamplingParams`` (``SamplingParams.for_variant``).
    Stops at EOS (unless ``ignore_eos``), at ``max_new_tokens``, or when every logit is -inf.
    """
    params = params.fitted_to(variant)
    cfg = uses_cfg(variant, params)
    session = T3SingleSequence(model, cond_embeds, text_ids, cfg, max_new_tokens=params.max_new_tokens)
    device = model.device
    batch = SamplingBatch.build([params], variant, device=device)
    seen = initial_penalty_mask(variant, 1, device=device)
    eos = variant.t3.stop_speech_token
    tokens: list[int] = []
    logits = session.prefill().float()
    prompt_length = session.cache.length
    reason: FinishReason = "length"
    while len(tokens) < params.max_new_tokens:
        steps = torch.tensor([len(tokens)], dtype=torch.int64, device=device)
        processed = process_logits(logits[:1], batch, seen, steps, uncond_logits=logits[1:2] if cfg else None)
        token = sample_next_tokens(processed, batch, steps)
        record_sampled_tokens(variant, seen, token, steps)
        value = int(token.item())
        if value == NO_TOKEN:
            reason = "exhausted"
            break
        if value == eos and not params.ignore_eos:
            reason = "eos"
            break
        tokens.append(value)
        if on_token is not None:
            on_token(value)
        if len(tokens) == params.max_new_tokens:
            break
        logits = session.decode(value).float()
    return SpeechTokens(tokens=tokens, finish_reason=reason, prompt_length=prompt_length)
