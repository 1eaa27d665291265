"""Attention over a KV cache, behind one small protocol shared by both backbones.

The backbones see a flat batch of N new tokens ("varlen" layout): embeddings [N, D] and
positions [N]. They never learn which row (sequence) a token belongs to; the cache object
owns that layout. For every layer a backbone calls ``cache.attend(layer, q, k, v)`` once with
the projected queries, keys and values of the N new tokens; the cache stores k/v and returns
the attention output. Llama calls ``cache.attend_rotary(layer, q, k, v, cos, sin, ops_backend)``
instead, with q and k not yet rotated: a cache may rotate them on their way into storage (the
engine's paged cache does so in one kernel, docs/engine.md); by default it is ``rope_qk`` then
``attend``. An implementation subclasses the protocol to inherit that default.

Contract of an implementation (what the engine's paged cache must also provide):

- Before a forward, the owner describes the batch: for each of the N tokens its row and its
  position inside that row, tokens of one row contiguous and in position order. Rows may have
  different numbers of new tokens (prefill chunks and single decode tokens mixed) and
  different numbers of already cached tokens. The positions given to the backbone must be
  the same positions.
- ``attend`` writes k/v of the new tokens to the row's cache slots for that position, then
  computes softmax(q k^T / sqrt(head_dim)) v for each new token over every cached or new token
  of *its own row* at a position <= its own (causal). No other masking, no bias, no dropout.
- After the forward, the owner commits the new tokens (they become context for the next step).
- When the owner sets ``keeper`` (a ``chorus.models.t3.alignment.QueryKeeper``), ``attend`` hands
  it each layer's rotated queries (``keeper.keep``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from chorus.models.t3.fused_ops import rope_qk

if TYPE_CHECKING:
    from chorus.models.t3.alignment import QueryKeeper


class AttentionCache(Protocol):
    """Per-layer KV storage plus causal attention for the batch layout set by its owner."""

    keeper: "QueryKeeper | None" = None  # set by the owner to keep the alignment heads' queries

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store ``k``/``v`` of the new tokens for ``layer`` and attend.

        q, k, v: [N, heads, head_dim] for the N new tokens of this forward, positions already
        encoded. Returns [N, heads, head_dim] in the layout of ``q``.
        """
        ...

    def attend_rotary(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, ops_backend: str = "auto") -> torch.Tensor:
        """``attend`` for q and k that are NOT yet rotated: rotate both as ``fused_ops.rope_qk``
        does (tables ``cos``/``sin`` [N, 1, head_dim] in q's dtype, ``ops_backend`` its backend),
        store k/v and attend. q and k may be views of one projection output.

        This default is ``rope_qk`` then ``attend``; a cache may fuse the rotation with its
        K/V write, with the same results.
        """
        q, k = rope_qk(q, k, cos, sin, ops_backend)
        return self.attend(layer, q, k, v)


class KVCacheFullError(RuntimeError):
    """More tokens were appended than the cache was allocated for."""


class ContiguousKVCache(AttentionCache):
    """Preallocated KV cache for ``rows`` sequences that always advance together.

    Every forward appends the same number of tokens to every row (e.g. the two rows of a CFG
    pair). Flattened token order is row-major: row 0's new tokens, then row 1's, and so on.
    Buffers are [layers, rows, max_len, heads, head_dim].

    Use: ``positions = cache.begin_step(n)``; run the backbone with those positions;
    ``cache.end_step()``.
    """

    def __init__(
        self, num_layers: int, rows: int, max_len: int, num_heads: int, head_dim: int, *,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ):
        assert num_layers > 0 and rows > 0 and max_len > 0
        shape = (num_layers, rows, max_len, num_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.rows = rows
        self.max_len = max_len
        self.length = 0  # committed tokens per row
        self._pending = 0  # tokens per row in the forward under way; 0 when none

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    def begin_step(self, tokens_per_row: int) -> torch.Tensor:
        """Announce ``tokens_per_row`` new tokens per row; returns their positions [rows * n]."""
        assert self._pending == 0, "begin_step called twice without end_step"
        assert tokens_per_row > 0
        if self.length + tokens_per_row > self.max_len:
            raise KVCacheFullError(
                f"KV cache holds {self.max_len} tokens per row; {self.length} are used and "
                f"{tokens_per_row} more were requested"
            )
        self._pending = tokens_per_row
        row_positions = torch.arange(
            self.length, self.length + tokens_per_row, device=self.keys.device
        )
        return row_positions.repeat(self.rows)

    def end_step(self) -> None:
        """Commit the tokens announced by the last ``begin_step``."""
        assert self._pending > 0, "end_step without begin_step"
        self.length += self._pending
        self._pending = 0

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        new = self._pending
        assert new > 0, "attend called outside begin_step/end_step"
        n_tokens, heads, head_dim = q.shape
        assert n_tokens == self.rows * new, (n_tokens, self.rows, new)
        start, end = self.length, self.length + new
        self.keys[layer, :, start:end] = k.view(self.rows, new, heads, head_dim)
        self.values[layer, :, start:end] = v.view(self.rows, new, heads, head_dim)
        if self.keeper is not None:
            self.keeper.keep(layer, q)

        # SDPA wants [rows, heads, time, head_dim]
        queries = q.view(self.rows, new, heads, head_dim).transpose(1, 2)
        keys = self.keys[layer, :, :end].transpose(1, 2)
        values = self.values[layer, :, :end].transpose(1, 2)
        if new == 1:
            out = F.scaled_dot_product_attention(queries, keys, values)
        elif start == 0:
            out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True)
        else:
            # causal with an offset: new token i sits at position start + i
            key_pos = torch.arange(end, device=q.device)
            query_pos = torch.arange(start, end, device=q.device)
            mask = key_pos[None, :] <= query_pos[:, None]
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)
        return out.transpose(1, 2).reshape(n_tokens, heads, head_dim)
