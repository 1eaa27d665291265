"""A stand-in decode loop for sampler tests: the "model" is a seeded function of (request, step,
previous token), so token sequences can be compared across batch layouts and devices."""
from __future__ import annotations

import torch

from chorus.models.variants import Variant
from chorus.sampling import (
    SamplingBatch, SamplingParams, initial_penalty_mask, process_logits, record_sampled_tokens, sample_next_tokens,
)


def fake_logits(request: int, step: int, last: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(request * 1_000_003 + step * 7919 + last)
    return torch.randn(vocab, generator=g) * 2


def generate(variant: Variant, requests: list[tuple[int, SamplingParams]], start_steps: list[int],
             num_steps: int, device: str = "cpu") -> list[list[int]]:
    """Decode ``num_steps`` tokens for every (request id, params) row with the full pipeline."""
    vocab = variant.t3.speech_vocab_size
    batch = SamplingBatch.build([p for _, p in requests], variant, device)
    seen = initial_penalty_mask(variant, len(requests), device)
    out: list[list[int]] = [[] for _ in requests]
    last = [variant.t3.start_speech_token] * len(requests)
    for offset in range(num_steps):
        step_list = [s + offset for s in start_steps]
        steps = torch.tensor(step_list, device=device)
        cond = torch.stack([fake_logits(rid, s, t, vocab) for (rid, _), s, t in zip(requests, step_list, last)])
        uncond = torch.stack([fake_logits(rid + 99, s, t, vocab) for (rid, _), s, t in zip(requests, step_list, last)])
        processed = process_logits(cond.to(device), batch, seen, steps,
                                   uncond_logits=uncond.to(device) if variant.t3.supports_cfg else None)
        tokens = sample_next_tokens(processed, batch, steps)
        record_sampled_tokens(variant, seen, tokens, steps)
        last = tokens.tolist()
        for row, t in enumerate(last):
            out[row].append(t)
    return out
