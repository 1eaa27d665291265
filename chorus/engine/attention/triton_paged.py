"""Triton kernels: paged attention over a block table (decode and chunked prefill), the KV write,
and the KV write fused with the rotary embedding of q and k (``rope_write_kv_triton``).

Same layouts and semantics as ``reference.py``. Importing this module imports Triton; the
package ``chorus.engine.attention`` does so only when a Triton path is taken.

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

import os

import torch
import triton
import triton.language as tl

from chorus.engine.attention.launch_plan import PagedLaunch, num_sms, plan_attention, query_blocks
from chorus.engine.attention.reference import FP8_E4M3_MAX, is_fp8
from chorus.models.t3.triton_ops import rope_heads

_LOG2E = 1.4426950408889634


@triton.jit
def _find_seq(qsl_ptr, base, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Last sequence whose first query block is <= q_block (first blocks strictly increase)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = (tl.load(qsl_ptr + mid) - base) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _query_block_tile(qb, acc, m_i, l_i, pos, valid, visible, qk_scale, table_row, k_head, v_head, offs_d,
                      stride_kb, stride_kt, stride_vb, stride_vt,
                      BLOCK_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K/V tile (positions ``pos``, ``valid`` inside the table) for a block of queries
    ``qb [M, D]`` with tensor-core products: scores masked by ``visible [M, TILE]``, then the
    online-softmax update of ``(acc, m_i, l_i)``, which it returns."""
    block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    slot_in_block = pos % BLOCK_SIZE
    kt = tl.load(k_head + (block * stride_kb + slot_in_block * stride_kt)[None, :]
                 + offs_d[:, None], mask=valid[None, :], other=0.0)
    s = tl.dot(qb, kt.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # a row that sees no key yet keeps max -inf; shift by 0 so exp2 gives 0, not NaN
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    v = tl.load(v_head + (block * stride_vb + slot_in_block * stride_vt)[:, None]
                + offs_d[None, :], mask=valid[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _store_partials(part_acc_ptr, part_ml_ptr, rows, row_ok, head, split, acc, m_i, l_i, num_rows,
                    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Unnormalised partials of ``rows``: acc [rows, heads, splits, D]; max and sum
    [2, rows, heads, splits] (what the reduce and merge kernels read)."""
    part = (rows.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + split
    tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], acc, mask=row_ok[:, None])
    tl.store(part_ml_ptr + part, m_i, mask=row_ok)
    tl.store(part_ml_ptr + num_rows * NUM_HEADS * NUM_SPLITS + part, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_seqs", "num_rows", "stride_bt"],
            do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "qsl_ptr", "k_scale_ptr",
                                            "v_scale_ptr", "kv_start_ptr"])
def _paged_attention_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr,
    k_scale_ptr, v_scale_ptr,
    scale_log2, num_seqs, num_rows,
    kv_start_ptr,
    stride_qn, stride_qh, stride_on, stride_oh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DECODE: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    LOOP_STAGES: tl.constexpr, HAS_SCALE: tl.constexpr,
    KV_START: tl.constexpr = False,
):
    pid_q = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    base = tl.load(qsl_ptr)
    if DECODE:
        seq = pid_q
        q_block = 0
    else:
        seq = _find_seq(qsl_ptr, base, pid_q, num_seqs, BLOCK_Q)
        q_block = pid_q - ((tl.load(qsl_ptr + seq) - base) // BLOCK_Q + seq)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len
    # keys seen by the last row of this block; tiles past it hold nothing for anyone here
    kv_len = tl.maximum(prefix + tl.minimum((q_block + 1) * BLOCK_Q, q_len), 0)
    table_skip = 0
    if KV_START:
        # decode only: another kernel attends the first kv_start[seq] keys (a shared prefix,
        # whole blocks, see triton_shared_prefix.py); walk the rest from the next table entry
        kv_skip = tl.load(kv_start_ptr + seq)
        table_skip = kv_skip // BLOCK_SIZE
        kv_len -= kv_skip
    num_tiles = tl.cdiv(kv_len, TILE)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
    if HAS_SCALE:  # FP8 pool: q.(k * ks) = (q.k) * ks
        qk_scale = scale_log2 * tl.load(k_scale_ptr)
    else:
        qk_scale = scale_log2

    offs_d = tl.arange(0, HEAD_DIM)
    offs_t = tl.arange(0, TILE)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt + table_skip
    k_head = k_cache_ptr + head * stride_kh
    v_head = v_cache_ptr + head * stride_vh

    if DECODE:
        rows = q_start + tl.arange(0, 1)
        row_ok = tl.full([1], 1, tl.int1)
        qv = tl.load(q_ptr + q_start.to(tl.int64) * stride_qn + head * stride_qh + offs_d)
        qv = qv.to(tl.float32) * qk_scale
        m_i = tl.full([1], float("-inf"), tl.float32)
        l_i = tl.zeros([1], tl.float32)
        acc = tl.zeros([1, HEAD_DIM], tl.float32)
        for t in tl.range(tile_lo, tile_hi, num_stages=LOOP_STAGES):
            pos = t * TILE + offs_t
            valid = pos < kv_len
            block = tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
            slot_in_block = pos % BLOCK_SIZE
            k = tl.load(k_head + (block * stride_kb + slot_in_block * stride_kt)[:, None]
                        + offs_d[None, :], mask=valid[:, None], other=0.0)
            s = tl.sum(k.to(tl.float32) * qv[None, :], axis=1)
            s = tl.where(valid, s, float("-inf"))[None, :]                     # [1, TILE]
            # every tile in range holds a visible key, so m_new is finite
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            v = tl.load(v_head + (block * stride_vb + slot_in_block * stride_vt)[:, None]
                        + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.sum(tl.trans(p) * v.to(tl.float32), axis=0)[None, :]
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
    else:
        offs_m = tl.arange(0, BLOCK_Q)
        local = q_block * BLOCK_Q + offs_m
        row_ok = local < q_len
        rows = q_start + local
        qb = tl.load(q_ptr + rows.to(tl.int64)[:, None] * stride_qn + head * stride_qh
                     + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
        last_visible = prefix + local
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
        for t in range(tile_lo, tile_hi):
            pos = t * TILE + offs_t
            valid = pos < kv_len
            acc, m_i, l_i = _query_block_tile(
                qb, acc, m_i, l_i, pos, valid, pos[None, :] <= last_visible[:, None], qk_scale, table_row,
                k_head, v_head, offs_d, stride_kb, stride_kt, stride_vb, stride_vt,
                BLOCK_SIZE, DOT_DTYPE, DOT_PRECISION)

    if HAS_SCALE:  # sum p (v * vs) = (sum p v) * vs; partials of every split carry it
        acc = acc * tl.load(v_scale_ptr)
    if NUM_SPLITS == 1 and not KV_START:
        res = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_on + head * stride_oh
                 + offs_d[None, :], res.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        _store_partials(part_acc_ptr, part_ml_ptr, rows, row_ok, head, split, acc, m_i, l_i, num_rows,
                        NUM_HEADS, HEAD_DIM, NUM_SPLITS)


@triton.jit(do_not_specialize=["num_seqs", "row_base", "num_rows"], do_not_specialize_on_alignment=["qsl_ptr"])
def _reduce_splits_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, qsl_ptr, num_seqs, row_base, num_rows,
    stride_on, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    row = row_base + tl.program_id(0)
    head = tl.program_id(1)
    if row >= tl.load(qsl_ptr + num_seqs):  # padding rows past the last sequence: no partials
        return
    offs_s = tl.arange(0, NUM_SPLITS)
    part = (row.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + offs_s
    m = tl.load(part_ml_ptr + part)
    l = tl.load(part_ml_ptr + num_rows * NUM_HEADS * NUM_SPLITS + part)
    m_max = tl.max(m, axis=0)
    weight = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))    # 0 for empty splits
    total = tl.sum(l * weight, axis=0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :])
    res = tl.sum(acc * weight[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + row.to(tl.int64) * stride_on + head * stride_oh + tl.arange(0, HEAD_DIM),
             res.to(out_ptr.dtype.element_ty))


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


def _dot_dtype(dtype: torch.dtype):
    # Triton 3.6's interpreter multiplies bf16 dot operands as raw uint16 bits; there, and
    # only there, the dots run in fp32
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return tl.float32
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


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
    plan = plan_attention(num_seqs, n_tokens, max_query_len, num_decodes, max_seq_len, heads, num_sms(q.device),
                          shared=shared_prefix is not None, decode_tile=decode_tile, prefill_tile=prefill_tile,
                          num_splits=num_splits)
    num_decodes = plan.num_decodes
    common = dict(q=q, key_cache=key_cache, value_cache=value_cache, out=out, scale=scale,
                  k_scale=k_scale, v_scale=v_scale)

    if plan.shared is not None:
        from chorus.engine.attention.triton_shared_prefix import shared_prefix_decode_triton

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


def _launch(*, launch: PagedLaunch, q, key_cache, value_cache, out, scale, k_scale, v_scale,
            block_tables, seq_lens, query_start_loc, row_base, row_count, tile,
            num_warps, loop_stages, num_stages, kv_start=None):
    """One kernel launch over a contiguous run of sequences (and their rows), as planned by
    ``launch`` (``launch_plan``: block size, splits).

    With ``kv_start`` (decode only: int32 per sequence, whole blocks) each sequence skips its
    first ``kv_start[seq]`` keys and the launch returns the unnormalised partials
    ``(part_acc, part_ml)`` instead of writing ``out``; the caller merges in the rest.
    """
    n_tokens, heads, head_dim = q.shape
    block_size = key_cache.shape[1]
    num_seqs = seq_lens.shape[0]
    block_q, num_splits = launch.block_q, launch.num_splits
    decode = block_q == 1
    q_blocks = query_blocks(block_q, num_seqs, row_count)
    assert launch.kv_start == (kv_start is not None) and (kv_start is None or decode), \
        "kv_start is for decode launches planned with it"
    if q_blocks == 0:
        return None
    assert num_splits == triton.next_power_of_2(num_splits), num_splits
    if num_splits > 1 or kv_start is not None:
        part_acc = torch.empty((n_tokens, heads, num_splits, head_dim), dtype=torch.float32,
                               device=q.device)
        part_ml = torch.empty((2, n_tokens, heads, num_splits), dtype=torch.float32,
                              device=q.device)
    else:
        part_acc = part_ml = out  # unused
    extra = {} if num_stages is None else {"num_stages": num_stages}
    _paged_attention_kernel[(q_blocks, heads, num_splits)](
        out, part_acc, part_ml,
        q, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        k_scale if k_scale is not None else seq_lens, v_scale if v_scale is not None else seq_lens,
        scale * _LOG2E, num_seqs, n_tokens,
        seq_lens if kv_start is None else kv_start,  # kv_start_ptr, read only with KV_START
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_Q=block_q, TILE=tile,
        NUM_SPLITS=num_splits, DECODE=decode,
        DOT_DTYPE=_dot_dtype(q.dtype), LOOP_STAGES=loop_stages,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", HAS_SCALE=k_scale is not None,
        KV_START=kv_start is not None, num_warps=num_warps, **extra,
    )
    if kv_start is not None:
        return part_acc, part_ml
    if num_splits > 1:
        _reduce_splits_kernel[(row_count, heads)](
            out, part_acc, part_ml, query_start_loc, num_seqs, row_base, n_tokens,
            out.stride(0), out.stride(1),
            NUM_HEADS=heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits, num_warps=1,
        )
    return None
