"""Triton kernels of shared-prefix ("cascade") decode attention; see ``shared_prefix.py``.

Three launches per layer for the decode rows, none of which reads device data on the host
(fixed grids for given ``num_decodes``, ``max_groups`` and ``max_seq_len``: CUDA-graph safe):

1. ``_prefix_kernel``, one program per (group tile, head, prefix split). A group tile is up to
   ``BLOCK_G`` rows of one group; group ``g`` owns tiles ``[group_start[g] // BLOCK_G + g,
   group_start[g + 1] // BLOCK_G + g + 1)`` (the query-block numbering of ``triton_paged``, so
   the same binary search finds a program's group and spare programs exit at once). The
   program gathers its rows' queries into a [BLOCK_G, D] tile and streams the prefix K/V tiles
   of its share of ``[0, prefix_len)`` once for all of them: Q @ K^T and P @ V on tensor cores.
   Every row of a group sees every prefix key (the prefix ends before each row's last
   position), so there is no causal mask. It writes unnormalised partials (acc, max, sum).
2. The ordinary decode kernel (``triton_paged_kernel``) with ``KV_START``: each row attends only
   ``[prefix_len[row], seq_len)`` and writes its partials (rows in no group: the whole context).
3. ``_merge_kernel``, one program per (decode row, head): merges the suffix splits and, when
   the row has a prefix, the prefix splits, and writes the normalised output.

FP8 pools (``HAS_SCALE``): the two launches that read K/V (1 and 2) apply the layer's scales as
the plain kernel does (the K scale folded into the score scale, the V scale multiplied into each
partial's accumulator), so the merge sees the partials of dequantised K/V.

Exactness: the same math as plain paged attention; only the order of the float sums changes
(and, for bf16/fp16, P is rounded to the input dtype before P @ V in the prefix tiles, as in the
prefill kernel, where the decode kernel multiplies in fp32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.engine.attention.launch_plan import SharedLaunch, num_sms, plan_shared
from chorus.engine.attention.shared_prefix import SharedPrefixTensors
from chorus.engine.attention.triton_paged_kernel import (
    _LOG2E, _dot_dtype, _find_seq, _launch, _query_block_tile, _store_partials,
)


# counts that change with the batch, and pointers read only as scalars or gathered entries (see
# triton_paged.py, "Variants")
@triton.jit(do_not_specialize=["max_groups", "num_rows", "stride_bt"],
            do_not_specialize_on_alignment=["block_tables_ptr", "qsl_ptr", "prefix_len_ptr", "group_rows_ptr",
                                            "group_start_ptr", "k_scale_ptr", "v_scale_ptr"])
def _prefix_kernel(
    part_acc_ptr, part_ml_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, qsl_ptr,
    prefix_len_ptr, group_rows_ptr, group_start_ptr, k_scale_ptr, v_scale_ptr,
    scale_log2, max_groups, num_rows,
    stride_qn, stride_qh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bt,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    group = _find_seq(group_start_ptr, 0, pid, max_groups, BLOCK_G)
    g_start = tl.load(group_start_ptr + group)
    g_len = tl.load(group_start_ptr + group + 1) - g_start
    tile_in_group = pid - (g_start // BLOCK_G + group)
    if tile_in_group * BLOCK_G >= g_len:  # spare program, or a group past num_groups (empty)
        return
    offs_g = tl.arange(0, BLOCK_G)
    local = tile_in_group * BLOCK_G + offs_g
    row_ok = local < g_len
    seqs = tl.load(group_rows_ptr + g_start + local, mask=row_ok, other=0)
    rows = tl.load(qsl_ptr + seqs, mask=row_ok, other=0).to(tl.int64)    # token of each row
    leader = tl.load(group_rows_ptr + g_start)                            # whose table we walk
    prefix_len = tl.load(prefix_len_ptr + leader)

    num_tiles = tl.cdiv(prefix_len, TILE)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
    if HAS_SCALE:  # FP8 pool, as in _paged_attention_kernel: q.(k * ks) = (q.k) * ks
        qk_scale = scale_log2 * tl.load(k_scale_ptr)
    else:
        qk_scale = scale_log2

    offs_d = tl.arange(0, HEAD_DIM)
    offs_t = tl.arange(0, TILE)
    table_row = block_tables_ptr + leader.to(tl.int64) * stride_bt
    k_head = k_cache_ptr + head * stride_kh
    v_head = v_cache_ptr + head * stride_vh
    qb = tl.load(q_ptr + rows[:, None] * stride_qn + head * stride_qh + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for t in range(tile_lo, tile_hi):
        pos = t * TILE + offs_t
        valid = pos < prefix_len
        # every tile holds a valid key for every row: m_i stays finite
        acc, m_i, l_i = _query_block_tile(
            qb, acc, m_i, l_i, pos, valid, valid[None, :], qk_scale, table_row, k_head, v_head, offs_d,
            stride_kb, stride_kt, stride_vb, stride_vt, BLOCK_SIZE, DOT_DTYPE, DOT_PRECISION)
    if HAS_SCALE:  # sum p (v * vs) = (sum p v) * vs
        acc = acc * tl.load(v_scale_ptr)
    _store_partials(part_acc_ptr, part_ml_ptr, rows, row_ok, head, split, acc, m_i, l_i, num_rows,
                    NUM_HEADS, HEAD_DIM, NUM_SPLITS)


@triton.jit(do_not_specialize=["num_rows"], do_not_specialize_on_alignment=["qsl_ptr", "prefix_len_ptr"])
def _merge_kernel(
    out_ptr, suf_acc_ptr, suf_ml_ptr, pre_acc_ptr, pre_ml_ptr, qsl_ptr, prefix_len_ptr, num_rows,
    stride_on, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SUFFIX_SPLITS: tl.constexpr,
    PREFIX_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) == row:  # padding sequence without a query: no partials
        return
    row = row.to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_s = tl.arange(0, SUFFIX_SPLITS)
    suf = (row * NUM_HEADS + head) * SUFFIX_SPLITS + offs_s
    m_s = tl.load(suf_ml_ptr + suf)
    l_s = tl.load(suf_ml_ptr + num_rows * NUM_HEADS * SUFFIX_SPLITS + suf)
    acc_s = tl.load(suf_acc_ptr + suf[:, None] * HEAD_DIM + offs_d[None, :])
    # rows in no group have no prefix partials: read none (the buffer holds garbage there)
    offs_p = tl.arange(0, PREFIX_SPLITS)
    has = offs_p < tl.where(tl.load(prefix_len_ptr + seq) > 0, PREFIX_SPLITS, 0)
    pre = (row * NUM_HEADS + head) * PREFIX_SPLITS + offs_p
    m_p = tl.load(pre_ml_ptr + pre, mask=has, other=float("-inf"))
    l_p = tl.load(pre_ml_ptr + num_rows * NUM_HEADS * PREFIX_SPLITS + pre, mask=has, other=0.0)
    acc_p = tl.load(pre_acc_ptr + pre[:, None] * HEAD_DIM + offs_d[None, :], mask=has[:, None],
                    other=0.0)
    m_max = tl.maximum(tl.max(m_s, axis=0), tl.max(m_p, axis=0))
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)                   # no key at all
    w_s = tl.exp2(m_s - m_max)                                             # 0 for empty splits
    w_p = tl.exp2(m_p - m_max)
    total = tl.sum(l_s * w_s, axis=0) + tl.sum(l_p * w_p, axis=0)
    acc = tl.sum(acc_s * w_s[:, None], axis=0) + tl.sum(acc_p * w_p[:, None], axis=0)
    res = acc / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + row * stride_on + head * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty))


def shared_prefix_decode_triton(
    q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
    scale: float, shared: SharedPrefixTensors, *, num_decodes: int, max_seq_len: int,
    out: torch.Tensor, decode_tile: int = 64, decode_warps: int = 4, decode_stages: int = 3,
    num_splits: int | None = None, prefix_tile: int = 64, block_g: int | None = None,
    prefix_splits: int | None = None, prefix_warps: int = 4, launch: SharedLaunch | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """Attention of the decode rows ``0:num_decodes`` by the shared-prefix decomposition.

    Arguments as ``paged_attention_triton``'s (``max_seq_len`` bounds every context, hence
    every prefix); ``shared`` holds the plan. Writes those rows of ``out``. ``launch``: the
    launches as ``launch_plan.plan_shared`` chose them (None: chosen here, with ``num_splits``,
    ``block_g`` and ``prefix_splits`` as overrides). ``k_scale`` / ``v_scale``: an FP8 pool's
    scales (both or neither), read on the device by the prefix and suffix launches as the plain
    kernel reads them.
    """
    n_tokens, heads, head_dim = q.shape
    block_size = key_cache.shape[1]
    assert shared.prefix_len.shape[0] >= num_decodes, "the plan covers fewer rows than the batch"
    for t in (shared.prefix_len, shared.group_rows, shared.group_start):
        assert t.dtype == torch.int32 and t.is_contiguous() and t.device == q.device
    assert (k_scale is None) == (v_scale is None), "give both KV scales or neither"
    if num_decodes == 0:
        return
    assert prefix_tile % block_size == 0 or block_size % prefix_tile == 0, (prefix_tile, block_size)

    if launch is None:
        launch = plan_shared(num_decodes, heads, max_seq_len, num_sms(q.device), decode_tile=decode_tile,
                             prefix_tile=prefix_tile, num_splits=num_splits, block_g=block_g,
                             prefix_splits=prefix_splits)
    suffix = _launch(
        launch=launch.suffix, q=q, key_cache=key_cache, value_cache=value_cache, out=out, scale=scale,
        block_tables=block_tables[:num_decodes],
        seq_lens=seq_lens[:num_decodes], query_start_loc=query_start_loc[:num_decodes + 1],
        row_base=0, row_count=num_decodes, tile=decode_tile, num_warps=decode_warps,
        loop_stages=decode_stages, num_stages=None, kv_start=shared.prefix_len, k_scale=k_scale, v_scale=v_scale,
    )
    suf_acc, suf_ml = suffix

    block_g, prefix_splits = launch.block_g, launch.prefix_splits
    assert block_g >= 16 and block_g == triton.next_power_of_2(block_g), block_g
    assert prefix_splits == triton.next_power_of_2(prefix_splits), prefix_splits
    pre_acc = torch.empty((n_tokens, heads, prefix_splits, head_dim), dtype=torch.float32,
                          device=q.device)
    pre_ml = torch.empty((2, n_tokens, heads, prefix_splits), dtype=torch.float32, device=q.device)
    group_tiles = num_decodes // block_g + shared.max_groups
    has_scale = k_scale is not None
    if shared.max_groups > 0:
        _prefix_kernel[(group_tiles, heads, prefix_splits)](
            pre_acc, pre_ml, q, key_cache, value_cache, block_tables, query_start_loc,
            shared.prefix_len, shared.group_rows, shared.group_start,
            k_scale if has_scale else shared.prefix_len, v_scale if has_scale else shared.prefix_len,
            scale * _LOG2E, shared.max_groups, n_tokens,
            q.stride(0), q.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            block_tables.stride(0),
            NUM_HEADS=heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_G=block_g,
            TILE=prefix_tile, NUM_SPLITS=prefix_splits, DOT_DTYPE=_dot_dtype(q.dtype),
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", HAS_SCALE=has_scale,
            num_warps=prefix_warps,
        )
    _merge_kernel[(num_decodes, heads)](
        out, suf_acc, suf_ml, pre_acc, pre_ml, query_start_loc, shared.prefix_len, n_tokens,
        out.stride(0), out.stride(1),
        NUM_HEADS=heads, HEAD_DIM=head_dim, SUFFIX_SPLITS=suf_acc.shape[2],
        PREFIX_SPLITS=prefix_splits, num_warps=1,
    )
