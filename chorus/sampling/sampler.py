"""Drawing one token per row from processed logits, without host synchronisation.

Sampling rows use the exponential race: ``argmax(probs / E)`` with E ~ Exp(1) per token is one
draw from ``probs``. E comes from ``counter_rng``, a pure function of (seed, step, token), so a
request's tokens depend only on its own seed and logits, never on the rest of the batch, and the
same inputs give the same token on CPU and CUDA. Greedy rows take the argmax (first index on
ties).

On CUDA the noise, the add, the argmax and the greedy / exhausted rules run as one Triton
kernel (``triton_sampler.py``) with the same integer hash and the same float64 logs; the
PyTorch code below is its reference and the CPU path (``backend``: see
:mod:`chorus.triton_backend`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from chorus.sampling.batch import SamplingBatch
from chorus.sampling.counter_rng import gumbel_noise
from chorus.triton_backend import use_triton

_KERNELS = "chorus.sampling.triton_sampler"

# Returned for a row whose processed logits are all -inf: stop it without a token.
NO_TOKEN = -1


def sample_next_tokens(processed: Tensor, batch: SamplingBatch, steps: Tensor, *, backend: str = "auto") -> Tensor:
    """One token per row: [R] int64 on the logits' device.

    ``processed``: [R, V] output of ``process_logits``; ``steps``: [R] int64, the index of the
    token being drawn in each request (tokens generated so far), the counter of the noise.
    Rows with no finite logit get ``NO_TOKEN`` (the Turbo reference stops there).
    ``backend``: ``"auto"`` (the Triton kernel for CUDA tensors), ``"triton"`` or ``"torch"``.
    """
    assert processed.dim() == 2 and processed.shape[0] == batch.num_rows, processed.shape
    if use_triton(backend, processed, _KERNELS, "sampler"):
        from chorus.sampling.triton_sampler import sample_triton

        return sample_triton(processed, batch.seed_lanes, steps.to(torch.int64), batch.greedy, batch.all_greedy,
                             NO_TOKEN)
    return sample_reference(processed, batch, steps)


def sample_reference(processed: Tensor, batch: SamplingBatch, steps: Tensor) -> Tensor:
    """The PyTorch path of :func:`sample_next_tokens`: the reference of its Triton kernel."""
    if batch.all_greedy:
        scores = processed
    else:
        noise = gumbel_noise(batch.seed_lanes, steps, processed.shape[1])
        if batch.any_greedy:
            noise = noise.masked_fill(batch.greedy[:, None], 0.0)
        scores = processed.to(torch.float64) + noise
    tokens = scores.argmax(dim=-1)
    exhausted = (processed == float("-inf")).all(dim=-1)
    return tokens.masked_fill(exhausted, NO_TOKEN)
