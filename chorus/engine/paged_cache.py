"""The paged KV cache: T3's ``AttentionCache`` protocol over the engine's block pool.

Per layer, keys and values live in ``[num_blocks, block_size, heads, head_dim]`` tensors
(one allocation for all layers). Before each forward the model runner sets an
``AttentionMetadata`` describing the flat batch (which slot each new token writes, each row's
block table, context length and query span); the backbone then calls ``attend`` (or, for Llama,
``attend_rotary``) once per layer.

The pool's dtype is the model's, or FP8 e4m3 (``kv_cache_dtype="fp8_e4m3"``): half the bytes
per block, values stored as ``fp8(x / scale)`` with one fp32 scale per layer for K and one for
V (``kv_scales [layers, 2]``, on the device). The scales are set once before serving
(``set_kv_scales``, from ``chorus.engine.kv_quant.kv_scales``) and never change afterwards, so captured CUDA
graphs stay valid and no step reads them on the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from chorus.engine.attention import (
    SharedPrefixTensors, is_fp8, paged_attention, rope_write_kv, uses_triton, write_kv,
)
from chorus.engine.attention.launch_plan import AttentionPlan, num_sms, plan_attention
from chorus.engine.config import KV_CACHE_DTYPES
from chorus.models.t3 import fused_ops
from chorus.models.t3.attention import AttentionCache

# the torch dtype of each pool dtype name (``chorus.engine.config.KV_CACHE_DTYPES`` owns the
# names; "auto" is the model's dtype)
_TORCH_KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn}
assert set(_TORCH_KV_DTYPES) == set(KV_CACHE_DTYPES) - {"auto"}


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """``CacheConfig.kv_cache_dtype`` as a torch dtype: "auto" is the model's dtype."""
    if name == "auto":
        return model_dtype
    if name not in _TORCH_KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {name!r}")
    return _TORCH_KV_DTYPES[name]


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
    attention_plan: the Triton path's kernel launches for this batch (``launch_plan.
    plan_attention``), the same for every layer: ``PagedKVCache`` plans them at the step's first
    attention and keeps them here, so later layers reuse them (a captured graph replays without
    planning at all). Left None off the Triton path.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_decodes: int
    shared_prefix: SharedPrefixTensors | None = None
    attention_plan: AttentionPlan | None = None

    @classmethod
    def single_row(cls, start: int, count: int, num_blocks: int, device: torch.device | str) -> AttentionMetadata:
        """One row whose table is blocks ``0 .. num_blocks - 1``, computing positions
        ``[start, start + count)`` (scratch caches: profiling, calibration, accuracy checks)."""
        length = start + count
        return cls(
            slot_mapping=torch.arange(start, length, device=device),
            block_tables=torch.arange(num_blocks, device=device, dtype=torch.int32)[None],
            seq_lens=torch.tensor([length], device=device, dtype=torch.int32),
            query_start_loc=torch.tensor([0, count], device=device, dtype=torch.int32),
            max_query_len=count, max_seq_len=length, num_decodes=1 if count == 1 else 0)


def kv_bytes_per_block(num_layers: int, block_size: int, num_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across all layers."""
    return 2 * num_layers * block_size * num_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class PagedKVCache(AttentionCache):
    """KV storage for ``num_blocks`` blocks plus attention over it (``AttentionCache``)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_heads: int,
                 head_dim: int, *, dtype: torch.dtype, device: torch.device | str,
                 backend: str = "auto"):
        """``dtype`` is the pool's: the model's, or ``torch.float8_e4m3fn`` (then K/V are
        scaled by ``kv_scales``, 1.0 until ``set_kv_scales``)."""
        self.kv = torch.zeros(num_layers, 2, num_blocks, block_size, num_heads, head_dim,
                              dtype=dtype, device=device)
        self.block_size = block_size
        self.scale = 1.0 / math.sqrt(head_dim)
        self.backend = backend
        self.metadata: AttentionMetadata | None = None
        self.quantized = is_fp8(dtype)
        # [layers, 2] fp32: K and V scale per layer; one-element views per layer, made once
        self.kv_scales = torch.ones(num_layers, 2, dtype=torch.float32, device=device)
        self._layer_scales = [(self.kv_scales[i, 0:1], self.kv_scales[i, 1:2]) for i in range(num_layers)]
        # calibration: when set, attend records max |k| and |v| per layer here ([layers, 2])
        self.observed_amax: torch.Tensor | None = None
        # backend decisions (uses_triton), which depend only on their arguments: made once,
        # not once per layer
        self._triton_attention: dict[tuple[str, bool], bool] = {}
        self._rotary_fusion: dict[tuple[str, str, bool], bool] = {}

    @property
    def num_blocks(self) -> int:
        return self.kv.shape[2]

    def set_kv_scales(self, scales: torch.Tensor) -> None:
        """Fix the per-layer K/V scales ``[layers, 2]`` (in place: graphs keep reading them).
        Call before any K/V is stored (stored values are not rescaled) and before graph capture."""
        assert self.quantized, "only an FP8 pool has scales"
        assert scales.shape == self.kv_scales.shape, (scales.shape, self.kv_scales.shape)
        self.kv_scales.copy_(scales)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self._metadata()
        key_cache, value_cache = self.kv[layer, 0], self.kv[layer, 1]
        if self.observed_amax is not None:
            _observe(self.observed_amax[layer], k, v)
        k_scale, v_scale = self._scales(layer)
        write_kv(key_cache, value_cache, k, v, meta.slot_mapping, k_scale=k_scale, v_scale=v_scale,
                 backend=self.backend)
        return self._attention(layer, q)

    def attend_rotary(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, ops_backend: str = "auto") -> torch.Tensor:
        """``AttentionCache.attend_rotary``: one kernel rotates q and k and stores k/v
        (``rope_write_kv``) when attention and the fused ops both run Triton for these tensors
        and no calibration records K/V; otherwise ``rope_qk`` then ``attend``. Both give the
        same bits."""
        if not self._fuses_rotary(q, ops_backend):
            return super().attend_rotary(layer, q, k, v, cos, sin, ops_backend)
        meta = self._metadata()
        k_scale, v_scale = self._scales(layer)
        q = rope_write_kv(q, k, v, cos, sin, self.kv[layer, 0], self.kv[layer, 1], meta.slot_mapping,
                          k_scale=k_scale, v_scale=v_scale, backend="triton")
        return self._attention(layer, q)

    def _fuses_rotary(self, q: torch.Tensor, ops_backend: str) -> bool:
        if self.observed_amax is not None:
            return False
        key = (self.backend, ops_backend, q.is_cuda)
        fuses = self._rotary_fusion.get(key)
        if fuses is None:
            fuses = self._rotary_fusion[key] = self._uses_triton(q) and fused_ops.uses_triton(ops_backend, q)
        return fuses

    def _uses_triton(self, q: torch.Tensor) -> bool:
        """``uses_triton(self.backend, q)``, decided once per backend and device kind."""
        key = (self.backend, q.is_cuda)
        found = self._triton_attention.get(key)
        if found is None:
            found = self._triton_attention[key] = uses_triton(self.backend, q)
        return found

    def _plan(self, meta: AttentionMetadata, q: torch.Tensor) -> AttentionPlan | None:
        """The step's Triton launches (what ``paged_attention_triton`` would plan for each layer),
        planned at its first attention and kept in the metadata; None off the Triton path."""
        if meta.attention_plan is None and self._uses_triton(q):
            meta.attention_plan = plan_attention(
                meta.seq_lens.shape[0], q.shape[0], meta.max_query_len, meta.num_decodes, meta.max_seq_len,
                q.shape[1], num_sms(q.device), shared=meta.shared_prefix is not None)
        return meta.attention_plan

    def flat_keys(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``layer``'s key store as ``[blocks * block_size, heads, head_dim]`` (slot order) and
        its dequantisation scale (None unless FP8)."""
        keys = self.kv[layer, 0]
        return keys.view(-1, *keys.shape[2:]), self._scales(layer)[0]

    def _metadata(self) -> AttentionMetadata:
        assert self.metadata is not None, "set PagedKVCache.metadata before the forward"
        return self.metadata

    def _scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self._layer_scales[layer] if self.quantized else (None, None)

    def _attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of the batch's queries over ``layer``'s cache, this step's K/V stored."""
        meta = self.metadata
        k_scale, v_scale = self._scales(layer)
        if self.keeper is not None:
            self.keeper.keep(layer, q)
        return paged_attention(
            q, self.kv[layer, 0], self.kv[layer, 1], meta.block_tables, meta.seq_lens, meta.query_start_loc,
            self.scale, max_query_len=meta.max_query_len, num_decodes=meta.num_decodes,
            max_seq_len=meta.max_seq_len, k_scale=k_scale, v_scale=v_scale, backend=self.backend,
            shared_prefix=meta.shared_prefix, plan=self._plan(meta, q),
        )


def _observe(amax: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``amax [2] = max(amax, (max |k|, max |v|))`` on the device (no host sync)."""
    step = torch.stack([k.detach().abs().amax(), v.detach().abs().amax()]).float()
    torch.maximum(amax, step, out=amax)
