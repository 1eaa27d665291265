"""Triton kernels: paged attention over a block table (decode and chunked prefill), the KV write,
and the KV write fused with the rotary embedding of q and k (``rope_write_kv_triton``).

Same layouts and semantics as ``reference.py``. Importing this module imports Triton; the
package ``chorus.engine.attention`` does so only when a Triton path is taken. The attention
kernel itself, its split reduction and their launch live in ``triton_paged_kernel.py``, which
``triton_shared_prefix.py`` imports too (so the two entry modules do not import each other).

Design (our own; vLLM's unified Triton attention was read for ideas):

- One program per (query block, head, KV split). A query block is ``BLOCK_Q`` consecutive new
  tokens of one sequence; sequence ``s`` owns query blocks
  ``[(qsl[s] - qsl[0]) // BLOCK_Q + s, (qsl[s + 1] - qsl[0]) // BLOCK_Q + s + 1)``, a range
  at least ``cdiv(q_len, BLOCK_Q)`` long, so the grid ``(N // BLOCK_Q + S, heads, splits)``
  is known on the host without reading device data (no sync; CUDA-graph safe). A program
  finds its sequence by binary search over ``query_start_loc``; spare programs exit at once.
- ``DECODE`` (``BLOCK_Q == 1``, every sequence has one new token): the query is one vector,
  scores are a broadcast multiply and row sum in fp32, no tensor-core padding to 16 rows.
- Otherwise Q [BLOCK_Q, D] @ K^T [D, TILE] with ``tl.dot`` (fp32 accumulation), causal mask
  ``key_pos <= seq_len - q_len + row``, online softmax in base 2, P @ V with ``tl.dot``.
- Split-KV (flash-decoding): when query blocks x heads cannot fill the GPU (small decode
  batches), each program walks only its share of the context tiles and writes an
  unnormalised partial (acc, max, sum); ``_reduce_splits_kernel`` merges them.
- The decode loop is software-pipelined with ``tl.range(num_stages=LOOP_STAGES)`` (cp.async
  into shared memory, seen in the sm_90 SASS); Triton pipelines the query-block loop by
  itself because its loads feed ``tl.dot``.
- FP8 pools (``HAS_SCALE``): K and V are loaded as fp8 and converted exactly to the dot
  dtype; the K scale is folded into the score scale and the V scale into the accumulator at
  the end, so dequantising costs two scalar loads per program, not a multiply per element.
  The writer divides by the scale (IEEE ``div_rn``, as the reference), saturates to +-448 and
  rounds to nearest even, so both paths store the same bytes.
- The fused RoPE + KV write reuses the RoPE kernel's rotation (``triton_ops.rope_heads``) and
  the writer's store (``_store_kv``), compiled without FP contraction as the RoPE kernel is, so
  it stores and returns exactly the two kernels' bits (docs/engine.md).
- The decode kernel trusts the caller: with ``max_query_len == 1`` or ``num_decodes``, a
  sequence given more than one new token would silently get only its first row attended.
- Variants: which kernels a call launches, with which ``BLOCK_Q`` and ``NUM_SPLITS``, is planned
  on the host by ``launch_plan.plan_attention``. Integer arguments that change from step to step
  (row and sequence counts, the block table's row stride) are ``do_not_specialize``, and the
  pointers the kernels only read scalars or gathered table entries from (block tables,
  ``seq_lens``, ``query_start_loc``, slots, KV scales) ``do_not_specialize_on_alignment``: their
  values and offsets vary with the batch (a slice from ``num_decodes`` on), and specialising on
  them would only compile more variants. Strides of the hot Q/K/V/out addressing stay
  specialised (fixed per model and pool). Results do not change: specialisation only changes
  code generation.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.engine.attention.launch_plan import AttentionPlan, num_sms, plan_attention
from chorus.engine.attention.reference import FP8_E4M3_MAX, is_fp8
from chorus.engine.attention.triton_paged_kernel import _launch
from chorus.engine.attention.triton_shared_prefix import shared_prefix_decode_triton
from chorus.models.t3.triton_ops import rope_heads


@triton.jit
def _store_kv(x, dst, mask, scale_ptr, QUANTIZE: tl.constexpr, HAS_SCALE: tl.constexpr, FP8_MAX: tl.constexpr):
    """Store K or V values ``x`` at the cache addresses ``dst``: as they are, or for an FP8 pool
    ``x / scale`` (IEEE division), saturated (e4m3fn has no inf), rounded to nearest even."""
    if QUANTIZE:
        x = x.to(tl.float32)
        if HAS_SCALE:
            x = tl.div_rn(x, tl.load(scale_ptr))
        x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
    tl.store(dst, x.to(dst.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize_on_alignment=["slot_ptr", "k_scale_ptr", "v_scale_ptr"])
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_kb, stride_kt, stride_kh_cache, stride_vb, stride_vt, stride_vh_cache,
    NUM_HEADS: tl.constexpr, HEADS_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, QUANTIZE: tl.constexpr, HAS_SCALE: tl.constexpr, FP8_MAX: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_P2)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_h < NUM_HEADS)[:, None]
    k = tl.load(k_ptr + token * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    _store_kv(k, k_cache_ptr + block * stride_kb + offset * stride_kt + offs_h[:, None] * stride_kh_cache
              + offs_d[None, :], mask, k_scale_ptr, QUANTIZE, HAS_SCALE, FP8_MAX)
    _store_kv(v, v_cache_ptr + block * stride_vb + offset * stride_vt + offs_h[:, None] * stride_vh_cache
              + offs_d[None, :], mask, v_scale_ptr, QUANTIZE, HAS_SCALE, FP8_MAX)


@triton.jit(do_not_specialize_on_alignment=["slot_ptr", "k_scale_ptr", "v_scale_ptr"])
def _rope_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, cos_ptr, sin_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_on, stride_oh,
    stride_cn, stride_sn,
    stride_kb, stride_kt, stride_kh_cache, stride_vb, stride_vt, stride_vh_cache,
    Q_HEADS: tl.constexpr, Q_HEADS_P2: tl.constexpr, KV_HEADS: tl.constexpr, KV_HEADS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, QUANTIZE: tl.constexpr, HAS_SCALE: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One token per program: rotate q into ``q_out``; rotate k and store it, and v, into the
    token's cache slot (none for slot -1). ``rope_heads`` and ``_store_kv`` are the very code of
    ``_rope_kernel`` and ``_write_kv_kernel``, so, compiled without FP contraction as they are,
    the results equal the two kernels' bit for bit."""
    token = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    c = tl.arange(0, HALF)[None, :]
    cos_row = cos_ptr + token * stride_cn
    sin_row = sin_ptr + token * stride_sn
    hq = tl.arange(0, Q_HEADS_P2)[:, None]
    q_mask = (hq < Q_HEADS) & (c < HALF)
    q1, q2 = rope_heads(q_ptr + token * stride_qn + hq * stride_qh, cos_row, sin_row, q_mask, HALF)
    q_out = q_out_ptr + token * stride_on + hq * stride_oh
    tl.store(q_out + c, q1, mask=q_mask)
    tl.store(q_out + HALF + c, q2, mask=q_mask)

    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    hk = tl.arange(0, KV_HEADS_P2)[:, None]
    kv_mask = (hk < KV_HEADS) & (c < HALF)
    k1, k2 = rope_heads(k_ptr + token * stride_kn + hk * stride_kh, cos_row, sin_row, kv_mask, HALF)
    k_dst = k_cache_ptr + block * stride_kb + offset * stride_kt + hk * stride_kh_cache
    _store_kv(k1, k_dst + c, kv_mask, k_scale_ptr, QUANTIZE, HAS_SCALE, FP8_MAX)
    _store_kv(k2, k_dst + HALF + c, kv_mask, k_scale_ptr, QUANTIZE, HAS_SCALE, FP8_MAX)
    d = tl.arange(0, HEAD_DIM)[None, :]
    v_mask = (hk < KV_HEADS) & (d < HEAD_DIM)
    v = tl.load(v_ptr + token * stride_vn + hk * stride_vh + d, mask=v_mask)
    _store_kv(v, v_cache_ptr + block * stride_vb + offset * stride_vt + hk * stride_vh_cache + d, v_mask,
              v_scale_ptr, QUANTIZE, HAS_SCALE, FP8_MAX)


def write_kv_triton(
    key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Triton version of ``reference.write_kv_reference``: no host sync, slot -1 skipped."""
    num_blocks, block_size, heads, head_dim = key_cache.shape
    assert value_cache.shape == key_cache.shape
    assert k.shape == v.shape and k.shape[1:] == (heads, head_dim), (k.shape, key_cache.shape)
    assert slot_mapping.shape == (k.shape[0],)
    for t in (k, v, key_cache, value_cache):
        assert t.stride(-1) == 1, "head_dim must be contiguous"
    assert head_dim == triton.next_power_of_2(head_dim), head_dim
    if k.shape[0] == 0:
        return
    has_scale = k_scale is not None
    _write_kv_kernel[(k.shape[0],)](
        k, v, key_cache, value_cache, slot_mapping,
        k_scale if has_scale else slot_mapping, v_scale if has_scale else slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        NUM_HEADS=heads, HEADS_P2=triton.next_power_of_2(heads), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, QUANTIZE=is_fp8(key_cache.dtype), HAS_SCALE=has_scale,
        FP8_MAX=FP8_E4M3_MAX, num_warps=4,
    )


def rope_write_kv_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rope_qk_triton`` then ``write_kv_triton`` in one launch (same results, bit for bit):
    returns the rotated q ``[N, Hq, Dh]`` (a new contiguous tensor); k is rotated on its way
    into the caches. q, k, v may be views of one projection output or separate tensors."""
    n, q_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = key_cache.shape
    assert value_cache.shape == key_cache.shape
    assert k.shape == v.shape == (n, kv_heads, head_dim), (q.shape, k.shape, v.shape, key_cache.shape)
    assert slot_mapping.shape == (n,)
    assert cos.shape[-1] == sin.shape[-1] == head_dim and cos.stride(-1) == sin.stride(-1) == 1
    assert cos.dtype == sin.dtype == q.dtype == k.dtype == v.dtype, (cos.dtype, q.dtype, k.dtype, v.dtype)
    for t in (q, k, v, key_cache, value_cache):
        assert t.stride(-1) == 1, "head_dim must be contiguous"
    assert head_dim >= 2 and head_dim == triton.next_power_of_2(head_dim), head_dim
    q_out = torch.empty((n, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if n == 0:
        return q_out
    has_scale = k_scale is not None
    _rope_write_kv_kernel[(n,)](
        q, k, v, q_out, cos, sin, key_cache, value_cache, slot_mapping,
        k_scale if has_scale else slot_mapping, v_scale if has_scale else slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), cos.stride(0), sin.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        Q_HEADS=q_heads, Q_HEADS_P2=triton.next_power_of_2(q_heads),
        KV_HEADS=kv_heads, KV_HEADS_P2=triton.next_power_of_2(kv_heads), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, QUANTIZE=is_fp8(key_cache.dtype), HAS_SCALE=has_scale,
        FP8_MAX=FP8_E4M3_MAX, num_warps=4,
        enable_fp_fusion=False,  # round as _rope_kernel does (see triton_ops.rope_heads)
    )
    return q_out


def paged_attention_triton(
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
    decode_tile: int = 64,
    decode_warps: int = 4,
    decode_stages: int = 3,
    prefill_tile: int = 64,
    num_splits: int | None = None,
    prefill_stages: int | None = None,
    shared_prefix=None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    plan: AttentionPlan | None = None,
) -> torch.Tensor:
    """Triton version of ``reference.paged_attention_reference`` (same arguments and result).

    Host-side hints, none of which reads device memory:
    - ``max_query_len``: the most new tokens of any sequence; 1 selects the decode kernel for
      all sequences. When None it is read from ``query_start_loc`` (one host sync).
    - ``num_decodes``: the first ``num_decodes`` sequences each have exactly one new token
      (their tokens come first); they run on the decode kernel, the rest on the query-block
      kernel. The caller guarantees this; it is not checked.
    - ``max_seq_len``: an upper bound on seq_lens used to size the KV split; defaults to the
      block table's capacity.
    - ``shared_prefix`` (a ``SharedPrefixTensors``): the decode rows read their groups' shared
      prefixes once per group (``triton_shared_prefix.py``); prefill rows are untouched.
    - ``plan``: the launches ``launch_plan.plan_attention`` chose for these arguments (a step
      plans once for all its layers); None plans them here, with the tuning keywords.
    The remaining keywords tune the launch (benchmarks); defaults are the chosen ones.
    Rows of ``out`` past ``query_start_loc[-1]`` are not written.
    """
    n_tokens, heads, head_dim = q.shape
    num_blocks, block_size = key_cache.shape[:2]
    num_seqs = seq_lens.shape[0]
    assert key_cache.shape[2:] == (heads, head_dim) and value_cache.shape == key_cache.shape
    assert query_start_loc.shape == (num_seqs + 1,) and block_tables.shape[0] == num_seqs
    assert head_dim == triton.next_power_of_2(head_dim) and head_dim >= 16, head_dim
    assert block_size == triton.next_power_of_2(block_size), block_size
    for t in (q, key_cache, value_cache):
        assert t.stride(-1) == 1, "head_dim must be contiguous"
    assert block_tables.stride(1) == 1 and seq_lens.is_contiguous() and query_start_loc.is_contiguous()
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(-1) == 1
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0
    if max_seq_len is None:
        max_seq_len = block_tables.shape[1] * block_size
    if plan is None:
        plan = plan_attention(num_seqs, n_tokens, max_query_len, num_decodes, max_seq_len, heads, num_sms(q.device),
                              shared=shared_prefix is not None, decode_tile=decode_tile, prefill_tile=prefill_tile,
                              num_splits=num_splits)
    num_decodes = plan.num_decodes
    common = dict(q=q, key_cache=key_cache, value_cache=value_cache, out=out, scale=scale,
                  k_scale=k_scale, v_scale=v_scale)

    if plan.shared is not None:
        shared_prefix_decode_triton(
            q, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale,
            shared_prefix, num_decodes=num_decodes, max_seq_len=max_seq_len, out=out,
            decode_tile=decode_tile, decode_warps=decode_warps, decode_stages=decode_stages,
            launch=plan.shared, k_scale=k_scale, v_scale=v_scale)
    elif plan.decode is not None:
        _launch(**common, launch=plan.decode, block_tables=block_tables[:num_decodes], seq_lens=seq_lens[:num_decodes],
                query_start_loc=query_start_loc[:num_decodes + 1], row_base=0,
                row_count=num_decodes, tile=decode_tile, num_warps=decode_warps,
                loop_stages=decode_stages, num_stages=None)
    if plan.query_block is not None:
        _launch(**common, launch=plan.query_block, block_tables=block_tables[num_decodes:],
                seq_lens=seq_lens[num_decodes:], query_start_loc=query_start_loc[num_decodes:], row_base=num_decodes,
                row_count=n_tokens - num_decodes, tile=prefill_tile, num_warps=4,
                loop_stages=1, num_stages=prefill_stages)
    return out
