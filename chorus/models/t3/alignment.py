"""Text-speech alignment read from T3's own attention, as a side output of a forward.

The Llama T3 (original, multilingual) aligns speech to text in a few attention heads; the
reference's alignment analyzer (chatterbox 0.1.7) reads layer 12 head 15, layer 13 head 11 and
layer 9 head 2, and averages their attention probabilities. A cache with a :class:`QueryKeeper`
keeps those heads' queries of each forward (one small copy per layer, also inside a captured
CUDA graph); after the forward, :class:`AlignmentTap` computes q.k, the causal softmax and the
text columns for the chosen queries only, from the kept queries and the keys the forward
stored. Nothing runs again: the fused attention kernels do not return probabilities, so the
tap recomputes them for one head per layer and the rows that asked.

The GPT-2 variants (Turbo, Nano) have no known alignment heads; :func:`alignment_heads` says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from chorus.models.variants import BackboneConfig

# (layer, head) pairs of the Llama T3 that the reference's alignment analyzer averages
LLAMA_ALIGNMENT_HEADS = ((12, 15), (13, 11), (9, 2))


def alignment_heads(config: BackboneConfig) -> tuple[tuple[int, int], ...]:
    """The (layer, head) pairs whose attention aligns speech to text for this backbone.
    Raises ValueError where none are known (GPT-2) or the stack lacks them (tiny test models)."""
    if config.kind != "llama":
        raise ValueError(f"no alignment heads are known for the {config.kind} T3 backbone (Turbo, Nano): "
                         "estimate timings from the text instead")
    for layer, head in LLAMA_ALIGNMENT_HEADS:
        if layer >= config.num_layers or head >= config.num_heads:
            raise ValueError(f"alignment head {head} of layer {layer} does not exist in a "
                             f"{config.num_layers}-layer, {config.num_heads}-head backbone")
    return LLAMA_ALIGNMENT_HEADS


class QueryKeeper:
    """Keeps the alignment heads' queries of every forward of a cache, in one fixed buffer
    ``[heads, max_tokens, head_dim]`` (fixed, so that a captured CUDA graph writes it too): the
    cache calls :meth:`keep` in ``attend`` with the rotated queries of each layer. Of a forward of
    more than ``max_tokens`` tokens, the first ``max_tokens`` are kept."""

    def __init__(self, heads: tuple[tuple[int, int], ...], max_tokens: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str):
        self.heads = heads
        self.buffer = torch.zeros(len(heads), max_tokens, head_dim, dtype=dtype, device=device)
        self._by_layer: dict[int, list[tuple[int, int]]] = {}
        for i, (layer, head) in enumerate(heads):
            self._by_layer.setdefault(layer, []).append((i, head))

    @property
    def capacity(self) -> int:
        return self.buffer.shape[1]

    def keep(self, layer: int, q: torch.Tensor) -> None:
        """``q`` [N, heads, head_dim]: ``layer``'s queries as attention sees them."""
        wanted = self._by_layer.get(layer)
        if wanted is None:
            return
        n = min(q.shape[0], self.capacity)
        for i, head in wanted:
            self.buffer[i, :n].copy_(q[:n, head])

    def queries(self, token_index: torch.Tensor) -> torch.Tensor:
        """[heads, len(token_index), head_dim]: the kept queries of those tokens of the last
        forward (each below ``capacity``)."""
        return self.buffer[:, token_index]


@dataclass
class AlignmentTap:
    """The attention probabilities from chosen queries of one forward to their row's text,
    computed after that forward from the queries a :class:`QueryKeeper` kept and the keys the
    forward stored (no second forward).

    For Q chosen queries: ``positions`` [Q] their positions, ``key_slots`` [Q, K] the index of
    each of their row's positions ``0 .. K-1`` in a layer's flattened key store (a cache's
    layout; at least position + 1 of them are real, later ones are masked out),
    ``text_start`` [Q] and ``text_len`` [Q] the span of their row's text positions
    (``text_len <= max_text``). All on the forward's device.
    """

    positions: torch.Tensor
    key_slots: torch.Tensor
    text_start: torch.Tensor
    text_len: torch.Tensor
    max_text: int

    def probabilities(self, queries: torch.Tensor, heads: tuple[tuple[int, int], ...], keys_of) -> torch.Tensor:
        """[Q, max_text] float32: the mean over ``heads`` of each query's attention probability on
        each text position (0 past ``text_len``). ``queries`` [heads, Q, head_dim] (rotated);
        ``keys_of(layer)`` -> (``[slots, heads, head_dim]`` flattened key store, its
        dequantisation scale or None)."""
        device = queries.device
        scale = 1.0 / math.sqrt(queries.shape[-1])
        future = torch.arange(self.key_slots.shape[1], device=device)[None, :] > self.positions[:, None]
        text = torch.arange(self.max_text, device=device)[None, :]
        outside = text >= self.text_len[:, None]
        columns = (self.text_start[:, None] + text).masked_fill(outside, 0)
        total = None
        for i, (layer, head) in enumerate(heads):
            keys, k_scale = keys_of(layer)
            key = keys[:, head][self.key_slots].float()  # [Q, K, D]
            if k_scale is not None:
                key = key * k_scale.float()
            scores = torch.einsum("qd,qkd->qk", queries[i].float(), key) * scale
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            picked = probs.gather(1, columns).masked_fill(outside, 0.0)
            total = picked if total is None else total + picked
        return total / len(heads)
