"""The paged-attention kernel, its split-KV reduction and their launch, with the Triton helpers
the shared-prefix kernel reuses: imported by ``triton_paged`` (plain paged attention) and
``triton_shared_prefix`` (whose suffix launch is this kernel with ``KV_START``, and whose
prefix kernel shares the sequence search, the query-block tile and the partials' store), so
neither of those imports the other.

The kernel's design (query blocks, the decode kernel, split-KV, FP8 scales, which arguments
are specialised) is described in ``triton_paged.py``; the launch choices are
``launch_plan``'s. Importing this module imports Triton.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from chorus.engine.attention.launch_plan import PagedLaunch, query_blocks

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



def _dot_dtype(dtype: torch.dtype):
    # Triton 3.6's interpreter multiplies bf16 dot operands as raw uint16 bits; there, and
    # only there, the dots run in fp32
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return tl.float32
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]



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
