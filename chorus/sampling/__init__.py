"""Sampling: per-request parameters, batched logits processing in each variant's order, and a
seeded sampler whose output does not depend on the rest of the batch (see docs/sampling.md)."""
from chorus.sampling.batch import SamplingBatch
from chorus.sampling.params import InvalidSamplingParams, SamplingParams
from chorus.sampling.penalty_set import initial_penalty_mask, penalty_mask_from_history, record_sampled_tokens
from chorus.sampling.processors import process_logits
from chorus.sampling.sampler import NO_TOKEN, sample_next_tokens

__all__ = [
    "InvalidSamplingParams", "NO_TOKEN", "SamplingBatch", "SamplingParams", "initial_penalty_mask",
    "penalty_mask_from_history", "process_logits", "record_sampled_tokens", "sample_next_tokens",
]
