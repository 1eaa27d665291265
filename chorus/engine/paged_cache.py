"""The paged KV cache: T3's ``AttentionCache`` protocol over the engine's block pool.

Per layer, keys and values live in ``[num_blocks, block_size, heads, head_dim]`` tensors
(one allocation for all layers). Before each forward the model runner sets an
``AttentionMetadata`` describing the flat batch (which slot each new token writes, each row's
block table, context length and query span); the backbone then calls ``attend`` once per layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from chorus.engine.attention import SharedPrefixTensors, paged_attention, write_kv


@dataclass
class AttentionMetadata:
    """Layout of one forward's flat batch of N new tokens over S rows.

    slot_mapping [N]: ``block * block_size + offset`` each new token writes (-1: skip).
    block_tables [S, max_blocks] int32; seq_lens [S] int32: context per row including the new
    tokens; query_start_loc [S + 1] int32: cumulative new tokens per row.
    max_query_len / max_seq_len: host-side bounds (no device sync needed).
    num_decodes: leading rows with exactly one new token (the decode kernel takes them).
    shared_prefix: optional plan (``plan_shared_prefixes`` over these block tables and
    ``num_decodes``) letting decode rows that share prefix blocks read them once per group.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_decodes: int
    shared_prefix: SharedPrefixTensors | None = None


def kv_bytes_per_block(num_layers: int, block_size: int, num_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across all layers."""
    return 2 * num_layers * block_size * num_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class PagedKVCache:
    """KV storage for ``num_blocks`` blocks plus attention over it (``AttentionCache``)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_heads: int,
                 head_dim: int, *, dtype: torch.dtype, device: torch.device | str,
                 backend: str = "auto"):
        self.kv = torch.zeros(num_layers, 2, num_blocks, block_size, num_heads, head_dim,
                              dtype=dtype, device=device)
        self.block_size = block_size
        self.scale = 1.0 / math.sqrt(head_dim)
        self.backend = backend
        self.metadata: AttentionMetadata | None = None

    @property
    def num_blocks(self) -> int:
        return self.kv.shape[2]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.metadata
        assert meta is not None, "set PagedKVCache.metadata before the forward"
        key_cache, value_cache = self.kv[layer, 0], self.kv[layer, 1]
        write_kv(key_cache, value_cache, k, v, meta.slot_mapping, backend=self.backend)
        return paged_attention(
            q, key_cache, value_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
            self.scale, max_query_len=meta.max_query_len, num_decodes=meta.num_decodes,
            max_seq_len=meta.max_seq_len, backend=self.backend, shared_prefix=meta.shared_prefix,
        )
