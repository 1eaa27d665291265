"""Logits processing with per-row parameters, in the variant's order.

Each step reproduces the transformers processor the reference uses (values, ties, the
"keep at least one token" rule, -inf as the filter value) for every row at once: no Python loop
over rows, no host synchronisation. A row whose parameter turns a step off passes through it
bit-for-bit unchanged.
"""
from __future__ import annotations

import torch
from torch import Tensor

from chorus.sampling.batch import SamplingBatch

FILTERED = float("-inf")


def combine_cfg(cond: Tensor, uncond: Tensor, weight: Tensor) -> Tensor:
    """``cond + w * (cond - uncond)`` per row; rows with w == 0 return ``cond`` whatever
    ``uncond`` holds (so rows without an unconditional partner may pass any placeholder)."""
    guided = cond + weight * (cond - uncond)
    return torch.where(weight == 0, cond, guided)


def ban_eos(logits: Tensor, steps: Tensor, min_new_tokens: Tensor, eos_token_id: int) -> Tensor:
    """Set EOS to -inf in rows whose step count is below their ``min_new_tokens``."""
    banned = (steps < min_new_tokens)[:, None]
    is_eos = torch.arange(logits.shape[1], device=logits.device) == eos_token_id
    return logits.masked_fill(banned & is_eos[None, :], FILTERED)


def apply_repetition_penalty(logits: Tensor, seen_mask: Tensor, penalty: Tensor) -> Tensor:
    """For ids in the row's penalty set: negative logits are multiplied by p, others divided."""
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen_mask, penalized, logits)


def apply_temperature(logits: Tensor, temperature: Tensor) -> Tensor:
    # True division by a tensor (not a reciprocal multiply) keeps the reference's exact values.
    return logits / temperature


def apply_min_p(logits: Tensor, min_p: Tensor) -> Tensor:
    """Drop ids whose probability is below ``min_p`` times the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    # The top id is never below min_p (<= 1) times itself, so at least one id always survives.
    return logits.masked_fill(probs < threshold, FILTERED)


def apply_top_k(logits: Tensor, top_k: Tensor, max_top_k: int) -> Tensor:
    """Keep ids whose logit is >= the row's k-th largest (ties at the boundary all stay);
    rows with k == 0 are untouched, k above the vocabulary keeps everything."""
    widest = min(max_top_k, logits.shape[1])
    largest = logits.topk(widest, dim=-1).values  # sorted, descending
    kth = largest.gather(1, (top_k.clamp(1, widest) - 1)[:, None])
    kth = torch.where(top_k[:, None] > 0, kth, FILTERED)
    return logits.masked_fill(logits < kth, FILTERED)


def apply_top_p(logits: Tensor, cutoff: Tensor) -> Tensor:
    """Nucleus filter: in ascending order, drop ids whose cumulative probability is
    <= ``cutoff`` (= 1 - top_p; -1 turns it off), always keeping the most likely id."""
    # Same (unstable) sort call as the reference: with tied logits at the boundary, which of
    # them survives depends on the sort's order, and matching it keeps the -inf masks equal.
    ascending, order = torch.sort(logits, descending=False)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= cutoff
    drop_sorted[:, -1] = False
    drop = drop_sorted.scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, FILTERED)


def _sort_keys(logits: Tensor) -> Tensor:
    """int64 keys, one per id, ordered like the logits and then by id: the float's bits mapped
    to an order-preserving int32 (-0.0 counted as +0.0, as float comparison does), times 2**32,
    plus the id. All keys of a row differ, so ``topk`` on them has no ties to order."""
    bits = (logits + 0.0).view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    ids = torch.arange(logits.shape[1], device=logits.device, dtype=torch.int64)
    return ordered.to(torch.int64) * 2**32 + ids


def apply_top_k_top_p(logits: Tensor, top_k: Tensor, max_top_k: int, cutoff: Tensor) -> Tensor:
    """``apply_top_p(apply_top_k(logits, top_k, max_top_k), cutoff)`` without sorting the
    vocabulary: top-p only looks at the ``min(max_top_k, V)`` largest ids.

    Precondition (``SamplingBatch.top_p_in_top_k``): every row with top-p on (cutoff >= 0)
    has ``top_k > 0``. Rows with top-p off pass through top-k only.

    Exactness. After top-k, the finite logits of a row are its top-k candidates plus, when ties
    straddle the k-th value, more ids equal to that value ("extras"). The ascending row that
    ``apply_top_p`` sorts is therefore rebuilt exactly, value for value, from -inf, the extras
    and the candidates reversed; softmax and cumsum then run on an identical [R, V] tensor with
    the same calls, so the probabilities, the cumulative sums and the drop decision of every
    sorted position are bit-identical to the full-sort path on the same device. Only the map
    from sorted positions back to ids is chosen here: equal logits are placed in increasing id
    order, which is what a stable sort does (CUDA's radix sort for these vocabularies). A sort
    that orders ties otherwise (the CPU's) can differ from this path only by which of several
    exactly equal logits survives a cut that falls inside their tie group; the number of
    survivors, hence the distribution over logit values, is the same.
    """
    assert logits.dtype == torch.float32, logits.dtype  # the keys read the float's bits
    rows, vocab = logits.shape
    widest = min(max_top_k, vocab)
    # candidates by value descending, equal values by id descending (so reversed: id ascending)
    index = _sort_keys(logits).topk(widest, dim=-1).indices
    values = logits.gather(1, index)
    kth = values.gather(1, (top_k.clamp(1, widest) - 1)[:, None])
    kth = torch.where(top_k[:, None] > 0, kth, FILTERED)
    kept = logits.masked_fill(logits < kth, FILTERED)  # exactly apply_top_k
    candidates = values.masked_fill(values < kth, FILTERED)

    in_top = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, index, True)
    extras = (kept != FILTERED) & ~in_top  # all equal to kth; the smallest ids of its tie group
    first = vocab - widest  # sorted position of the smallest candidate
    position = torch.arange(vocab, device=logits.device)
    in_extras = (position >= first - extras.sum(dim=-1, keepdim=True)) & (position < first)
    ascending = torch.cat([logits.new_full((rows, first), FILTERED), candidates.flip(1)], dim=1)
    ascending = torch.where(in_extras, kth, ascending)

    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= cutoff
    drop_sorted[:, -1] = False
    drop = torch.zeros_like(in_top).scatter_(1, index, drop_sorted[:, first:].flip(1))
    # dropped sorted positions come first, so the extras dropped are those of smallest id
    dropped_extras = (drop_sorted & in_extras).sum(dim=-1, keepdim=True)
    drop |= extras & (extras.cumsum(dim=-1) <= dropped_extras)
    return kept.masked_fill(drop, FILTERED)


def process_logits(logits: Tensor, batch: SamplingBatch, seen_mask: Tensor | None, steps: Tensor,
                   *, uncond_logits: Tensor | None = None) -> Tensor:
    """Apply the batch's variant order to ``logits`` ([R, V] fp32, the conditional rows).

    - ``seen_mask``: [R, V] bool, the repetition-penalty set of each row (see ``penalty_set``);
      may be None when no row penalises.
    - ``steps``: [R] int64, tokens each request has generated so far (drives ``min_new_tokens``).
    - ``uncond_logits``: [R, V] fp32, row r = request r's unconditional (CFG) row; required
      when some row has ``cfg_weight > 0``; rows with weight 0 ignore their entry.

    EOS is banned (``min_new_tokens``/``ignore_eos``) right after the CFG combine, before any
    other step. Returns new [R, V] fp32 logits; filtered ids hold -inf. Inputs are not modified.
    """
    rows = batch.num_rows
    if logits.dim() != 2 or logits.shape[0] != rows or logits.dtype != torch.float32:
        raise ValueError(f"logits must be [{rows}, V] float32, got {tuple(logits.shape)} {logits.dtype}")
    active = batch.active_steps
    x = logits
    if "cfg" in active:
        if uncond_logits is None or uncond_logits.shape != logits.shape:
            raise ValueError("some rows use CFG: pass uncond_logits with the same shape as logits")
        x = combine_cfg(x, uncond_logits, batch.cfg_weight)
    if batch.bans_eos:
        x = ban_eos(x, steps, batch.min_new_tokens, batch.eos_token_id)
    for step in batch.order:
        if step not in active or step == "cfg":
            continue
        if step == "repetition_penalty":
            if seen_mask is None or seen_mask.shape != logits.shape or seen_mask.dtype != torch.bool:
                raise ValueError("some rows use a repetition penalty: pass seen_mask as [R, V] bool")
            x = apply_repetition_penalty(x, seen_mask, batch.repetition_penalty)
        elif step == "temperature":
            x = apply_temperature(x, batch.temperature)
        elif step == "min_p":
            x = apply_min_p(x, batch.min_p)
        elif step == "top_k" and batch.top_p_in_top_k:
            x = apply_top_k_top_p(x, batch.top_k, batch.max_top_k, batch.top_p_cutoff)
        elif step == "top_k":
            x = apply_top_k(x, batch.top_k, batch.max_top_k)
        elif step == "top_p":
            if not batch.top_p_in_top_k:  # else already applied with top-k
                x = apply_top_p(x, batch.top_p_cutoff)
        else:
            raise AssertionError(f"unknown sampling step {step!r}")
    return x
