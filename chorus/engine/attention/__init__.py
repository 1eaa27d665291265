"""Paged attention for the engine: a Triton kernel on CUDA, a plain PyTorch path elsewhere.

Layouts and semantics are documented in ``reference.py``. Both entry points take
``backend``: ``"auto"``, ``"triton"`` or ``"torch"``, chosen as for every kernel package
(:mod:`chorus.triton_backend`); Triton is imported lazily.
"""
from __future__ import annotations

import torch

from chorus.engine.attention.launch_plan import AttentionPlan
from chorus.engine.attention.reference import (
    dequantize_kv, is_fp8, paged_attention_reference, quantize_kv, write_kv_reference,
)
from chorus.engine.attention.shared_prefix import (
    SharedPrefixPlan, SharedPrefixTensors, plan_shared_prefixes, shared_prefix_attention_reference,
)
from chorus.models.t3 import fused_ops
from chorus.triton_backend import kernels_import, use_triton

__all__ = [
    "SharedPrefixPlan",
    "SharedPrefixTensors",
    "dequantize_kv",
    "is_fp8",
    "paged_attention",
    "paged_attention_reference",
    "plan_shared_prefixes",
    "quantize_kv",
    "rope_write_kv",
    "triton_available",
    "uses_triton",
    "write_kv",
    "write_kv_reference",
]

_KERNELS = "chorus.engine.attention.triton_paged"


def triton_available() -> bool:
    """Whether the Triton kernels import (Triton installed and the module compiles)."""
    return kernels_import(_KERNELS)


def uses_triton(backend: str, tensor: torch.Tensor) -> bool:
    """Whether attention with ``backend`` runs the Triton kernels for ``tensor``."""
    return use_triton(backend, tensor, _KERNELS, "attention")


def _check_scales(cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> None:
    if (k_scale is None) != (v_scale is None):
        raise ValueError("give both k_scale and v_scale, or neither")
    if k_scale is not None:
        if not is_fp8(cache.dtype):
            raise ValueError(f"KV scales apply to FP8 caches only; this cache is {cache.dtype}")
        for s in (k_scale, v_scale):
            assert s.dtype == torch.float32 and s.numel() == 1 and s.device == cache.device, \
                "a KV scale is a one-element fp32 tensor on the cache's device"


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
) -> None:
    """Store the new tokens' ``k``/``v`` ``[N, heads, head_dim]`` into the paged caches.

    ``slot_mapping[N]`` (int32 or int64) is ``block_id * block_size + offset`` per token;
    -1 skips the token. The Triton path never syncs with the host (CUDA-graph safe).
    FP8 caches (``torch.float8_e4m3fn``) store ``x / scale`` saturated to +-448
    (``reference.quantize_kv``); ``k_scale`` / ``v_scale`` are one-element fp32 device tensors
    (None: 1.0), and only FP8 caches take them.
    """
    _check_scales(key_cache, k_scale, v_scale)
    if uses_triton(backend, k):
        from chorus.engine.attention.triton_paged import write_kv_triton

        write_kv_triton(key_cache, value_cache, k, v, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    else:
        write_kv_reference(key_cache, value_cache, k, v, slot_mapping, k_scale, v_scale)


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Rotate q and k (``fused_ops.rope_qk``: tables ``[N, 1, head_dim]`` in q's dtype), store
    the rotated k and v as ``write_kv`` does, and return the rotated q ``[N, Hq, head_dim]``.

    On the Triton path this is one kernel (``triton_paged.rope_write_kv_triton``) that gives
    exactly the bits of the RoPE kernel followed by the write kernel; the PyTorch path is
    ``fused_ops.rope_qk`` then ``write_kv``, both with ``backend="torch"``. Slot -1 skips a
    token's cache write, never its rotation.
    """
    _check_scales(key_cache, k_scale, v_scale)
    if uses_triton(backend, q):
        from chorus.engine.attention.triton_paged import rope_write_kv_triton

        return rope_write_kv_triton(q, k, v, cos, sin, key_cache, value_cache, slot_mapping,
                                    k_scale=k_scale, v_scale=v_scale)
    q, k = fused_ops.rope_qk(q, k, cos, sin, backend="torch")
    write_kv(key_cache, value_cache, k, v, slot_mapping, k_scale=k_scale, v_scale=v_scale, backend="torch")
    return q


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    num_decodes: int = 0,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    shared_prefix: SharedPrefixTensors | None = None,
    plan: AttentionPlan | None = None,
) -> torch.Tensor:
    """Causal attention of this step's new tokens over their sequences' paged KV.

    q ``[N, heads, head_dim]`` (RoPE applied); key/value caches ``[num_blocks, block_size,
    heads, head_dim]`` already holding this step's K/V (call ``write_kv`` first);
    block_tables ``[S, max_blocks]`` int32; seq_lens ``[S]`` int32, whole context including
    the new tokens; query_start_loc ``[S + 1]`` int32, cumulative new tokens per sequence.
    New token ``i`` of a sequence with ``q_len`` new tokens sees positions
    ``<= seq_len - q_len + i``. Returns ``[N, heads, head_dim]`` in q's dtype; a query that
    sees no key (``seq_len == 0``, for padding sequences) gets zeros; rows past
    ``query_start_loc[-1]`` are not written.

    Hints for the Triton path, all host-side (no device reads, CUDA-graph safe):
    ``max_query_len`` (1 = decode-only batch; None costs one host sync), ``num_decodes``
    (the first that many sequences have exactly one new token each and run on the decode
    kernel), ``max_seq_len`` (upper bound of seq_lens, sizes the KV split). The PyTorch path
    ignores them. FP8 caches are read as ``stored * k_scale`` / ``v_scale`` (see ``write_kv``).

    ``shared_prefix`` (from ``plan_shared_prefixes``, planned with the same ``num_decodes``):
    decode rows of a group read their shared prefix once per group (see ``shared_prefix.py``);
    same result up to float summation order. Both paths take the decomposition; with it, give
    ``num_decodes`` (the Triton path otherwise treats every row of a decode-only batch as one).
    FP8 scales apply to both halves of the decomposition, as on the plain path.

    ``plan``: the Triton path's launches for exactly these arguments (``launch_plan.
    plan_attention`` with the default tiles, ``num_sms(q.device)`` and ``shared=shared_prefix
    is not None``), e.g. planned once per step for every layer; None plans them here. The
    PyTorch path ignores it.
    """
    _check_scales(key_cache, k_scale, v_scale)
    if uses_triton(backend, q):
        from chorus.engine.attention.triton_paged import paged_attention_triton

        return paged_attention_triton(
            q, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale,
            max_query_len=max_query_len, num_decodes=num_decodes, max_seq_len=max_seq_len,
            out=out, shared_prefix=shared_prefix, k_scale=k_scale, v_scale=v_scale, plan=plan,
        )
    if shared_prefix is None or num_decodes == 0:
        return paged_attention_reference(
            q, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, out=out,
            k_scale=k_scale, v_scale=v_scale,
        )
    return _shared_prefix_reference(q, key_cache, value_cache, block_tables, seq_lens,
                                    query_start_loc, scale, shared_prefix, num_decodes, out,
                                    k_scale, v_scale)


def _shared_prefix_reference(q, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                             scale, shared, num_decodes, out, k_scale, v_scale) -> torch.Tensor:
    """PyTorch path with a plan: decode rows by the decomposition, the rest as usual."""
    if out is None:
        out = torch.zeros_like(q)
    shared_prefix_attention_reference(q, key_cache, value_cache, block_tables, seq_lens,
                                      query_start_loc, scale, shared, num_decodes, out,
                                      k_scale=k_scale, v_scale=v_scale)
    if num_decodes < seq_lens.shape[0]:
        base = int(query_start_loc[num_decodes])
        paged_attention_reference(
            q[base:], key_cache, value_cache, block_tables[num_decodes:], seq_lens[num_decodes:],
            query_start_loc[num_decodes:] - base, scale, out=out[base:], k_scale=k_scale, v_scale=v_scale)
    return out
