"""Text-speech alignment read from T3's own attention, as a side output of a forward.

The Llama T3 (original, multilingual) aligns speech to text in a few attention heads; the
reference's alignment analyzer (chatterbox 0.1.7) reads layer 12 head 15, layer 13 head 11 and
layer 9 head 2, and averages their attention probabilities. ``AlignmentTap`` computes those
probabilities for chosen query tokens only, inside the forward that computes the step: a cache
that holds a tap calls :meth:`AlignmentTap.record` in ``attend`` for the tap's layers, with the
step's (rotated) queries and its key store after this step's keys were written. Nothing else
is run again: the tap recomputes q.k for one head per layer and the chosen queries, which the
fused attention kernels do not return.

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


@dataclass
class AlignmentTap:
    """The attention probabilities from chosen queries of one forward to their row's text.

    For Q chosen query tokens of the forward's flat batch: ``query_index`` [Q] their index in
    the batch, ``positions`` [Q] their positions, ``key_slots`` [Q, K] the index of each of
    their row's positions ``0 .. K-1`` in a layer's flattened key store (a cache's layout; at
    least position + 1 of them are real, later ones are masked out), ``text_start`` [Q] and
    ``text_len`` [Q] the span of their row's text positions (``text_len <= max_text``). All on
    the forward's device. ``heads``: from :func:`alignment_heads`.

    After the forward, :meth:`probabilities` is [Q, max_text]: each query's attention
    probability on each text position, averaged over the heads (0 past ``text_len``).
    """

    heads: tuple[tuple[int, int], ...]
    query_index: torch.Tensor
    positions: torch.Tensor
    key_slots: torch.Tensor
    text_start: torch.Tensor
    text_len: torch.Tensor
    max_text: int

    def __post_init__(self):
        self._layers: dict[int, list[int]] = {}
        for layer, head in self.heads:
            self._layers.setdefault(layer, []).append(head)
        self._sum: torch.Tensor | None = None
        self._recorded = 0

    def wants(self, layer: int) -> bool:
        return layer in self._layers

    def record(self, layer: int, q: torch.Tensor, keys: torch.Tensor, k_scale: torch.Tensor | None = None) -> None:
        """Add ``layer``'s heads: ``q`` [N, heads, head_dim] the forward's queries as attention
        sees them (rotated), ``keys`` [slots, heads, head_dim] the layer's flattened key store
        holding this step's keys (``k_scale``: its dequantisation scale, FP8 stores)."""
        scale = 1.0 / math.sqrt(q.shape[-1])
        offsets = torch.arange(self.key_slots.shape[1], device=q.device)
        future = offsets[None, :] > self.positions[:, None]  # [Q, K]: causal mask
        columns = self.text_start[:, None] + torch.arange(self.max_text, device=q.device)[None, :]
        outside = torch.arange(self.max_text, device=q.device)[None, :] >= self.text_len[:, None]
        columns = columns.masked_fill(outside, 0)
        for head in self._layers[layer]:
            query = q[self.query_index, head].float()  # [Q, D]
            key = keys[:, head][self.key_slots].float()  # [Q, K, D]
            if k_scale is not None:
                key = key * k_scale.float()
            scores = torch.einsum("qd,qkd->qk", query, key) * scale
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            text = probs.gather(1, columns).masked_fill(outside, 0.0)
            self._sum = text if self._sum is None else self._sum + text
            self._recorded += 1

    def probabilities(self) -> torch.Tensor:
        """[Q, max_text] float32: the heads' mean attention on the text positions."""
        assert self._recorded == len(self.heads), f"recorded {self._recorded} of {len(self.heads)} heads"
        return self._sum / len(self.heads)
