"""Shared-prefix ("cascade") decode attention: the host planner and the PyTorch path.

With prefix caching, decode rows that share a voice begin their block tables with the same
physical block ids. Plain paged attention reads that prefix's K/V once per row; the shared
path reads it once per *group* of rows. It splits each decode row's context in two:

- the group's shared prefix, positions ``[0, prefix_len[row])``: attended for the whole group
  at once (Triton: one program streams each prefix K/V tile for up to ``BLOCK_G`` queries);
- the row's own suffix ``[prefix_len[row], seq_len)``: attended by the ordinary decode path.

Each half yields an unnormalised partial (acc, max, sum) per (row, head); merging them is the
split-KV merge. The math is plain attention's; only the float summation order differs.

The planner runs on the host in numpy (vectorised, no loop per row). Its arrays are sized for
all S rows of the batch whatever the grouping, so a CUDA-graph runner can copy them into
static device buffers (``SharedPrefixTensors.copy_``) and replay one captured graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from chorus.engine.attention.reference import dequantize_kv

_CHUNK_ROWS = 64


@dataclass
class SharedPrefixPlan:
    """Which decode rows share which prefix (host numpy arrays, int32).

    prefix_len [S]: tokens of the row's context attended by its group (a multiple of the block
      size; 0 for rows in no group, for prefill rows and padding).
    group_rows [S]: a permutation of ``range(S)``: the rows of group 0, then group 1, ...; the
      rows in no group follow in increasing order.
    group_start [S + 1]: group ``g`` owns ``group_rows[group_start[g]:group_start[g + 1]]``;
      entries past ``num_groups`` repeat ``group_start[num_groups]`` (empty groups).
    num_groups: groups in use. Every row of a group has the same ``prefix_len`` and the same
      block ids over it.
    """

    prefix_len: np.ndarray
    group_rows: np.ndarray
    group_start: np.ndarray
    num_groups: int

    @property
    def shared_rows(self) -> int:
        """Rows that attend a shared prefix."""
        return int(self.group_start[self.num_groups])

    @property
    def prefix_tokens_saved(self) -> int:
        """Prefix K/V token reads (per layer and head) that grouping removes."""
        counts = np.diff(self.group_start[: self.num_groups + 1])
        lens = self.prefix_len[self.group_rows[self.group_start[: self.num_groups]]]
        return int(((counts - 1) * lens).sum())


def empty_plan(num_rows: int) -> SharedPrefixPlan:
    """A plan with no groups (every row attends its whole context alone)."""
    return SharedPrefixPlan(
        prefix_len=np.zeros(num_rows, np.int32), group_rows=np.arange(num_rows, dtype=np.int32),
        group_start=np.zeros(num_rows + 1, np.int32), num_groups=0,
    )


def plan_shared_prefixes(
    block_tables: np.ndarray, seq_lens: np.ndarray, num_decodes: int, block_size: int, *,
    min_rows: int = 2, max_groups: int | None = None,
) -> SharedPrefixPlan:
    """Group the first ``num_decodes`` rows by their leading physical blocks.

    Rows are grouped by their first block id; a group's prefix is the longest run of leading
    block ids common to all its rows, counting only *full* blocks that lie strictly before
    each row's last (new) position, so the row's own suffix is never empty and a partially
    filled block (still being written) is never shared. Groups under ``min_rows`` rows or
    with no common full block are dropped (their rows get prefix 0). With ``max_groups``, only
    the groups saving the most prefix reads are kept (a captured CUDA graph launches programs
    for a fixed number of groups). Rows from ``num_decodes`` on (prefill) are never grouped.
    """
    block_tables = np.asarray(block_tables)
    seq_lens = np.asarray(seq_lens).astype(np.int64)
    num_rows = seq_lens.shape[0]
    assert block_tables.ndim == 2 and block_tables.shape[0] == num_rows, (block_tables.shape, num_rows)
    assert 0 <= num_decodes <= num_rows, (num_decodes, num_rows)
    assert min_rows >= 2, "a group of one row shares nothing"
    plan = empty_plan(num_rows)

    # full blocks strictly before each decode row's last position
    full = np.minimum(np.maximum(seq_lens[:num_decodes] - 1, 0) // block_size, block_tables.shape[1])
    cand = np.flatnonzero(full > 0)
    if cand.size < min_rows:
        return plan
    width = int(full[cand].max())
    tables = block_tables[cand, :width]
    order = np.argsort(tables[:, 0], kind="stable")
    cand, tables, full = cand[order], tables[order], full[cand][order]

    first = tables[:, 0]
    starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]])       # group heads
    sizes = np.diff(np.r_[starts, cand.size])
    leader = np.repeat(starts, sizes)                                    # per candidate row
    cols = np.arange(width)
    same = (tables == tables[leader]) & (cols[None, :] < full[:, None])
    run = np.where(same.all(axis=1), width, same.argmin(axis=1))         # leading common blocks
    blocks = np.minimum.reduceat(run, starts)

    keep = (sizes >= min_rows) & (blocks > 0)
    if max_groups is not None and keep.sum() > max_groups:
        saved = (sizes - 1) * blocks * keep
        best = np.argsort(-saved, kind="stable")[:max_groups]
        keep = np.zeros_like(keep)
        keep[best] = True
    if not keep.any():
        return plan

    member = np.repeat(keep, sizes)
    rows = cand[member]                                                  # grouped by group
    plan.prefix_len[rows] = np.repeat(blocks[keep] * block_size, sizes[keep])
    rest = np.setdiff1d(np.arange(num_rows), rows, assume_unique=True)
    plan.group_rows[:] = np.concatenate([rows, rest])
    num_groups = int(keep.sum())
    plan.group_start[1:num_groups + 1] = np.cumsum(sizes[keep])
    plan.group_start[num_groups + 1:] = plan.group_start[num_groups]
    plan.num_groups = num_groups
    return plan


@dataclass
class SharedPrefixTensors:
    """A plan on the device, for ``paged_attention(..., shared_prefix=...)``.

    ``max_groups`` is the host-side bound the kernels launch programs for: the plan in the
    tensors may use fewer groups (the rest are empty and exit at once), never more. Keep it
    fixed across replays of one CUDA graph and refresh the tensors with ``copy_``.
    """

    prefix_len: torch.Tensor    # [S] int32
    group_rows: torch.Tensor    # [S] int32
    group_start: torch.Tensor   # [S + 1] int32
    max_groups: int

    def __post_init__(self):
        rows = self.prefix_len.shape[0]
        assert self.group_rows.shape == (rows,) and self.group_start.shape == (rows + 1,)
        assert 0 <= self.max_groups <= rows, (self.max_groups, rows)

    @classmethod
    def from_plan(cls, plan: SharedPrefixPlan, device: torch.device | str,
                  max_groups: int | None = None) -> SharedPrefixTensors:
        """Device copies of ``plan``; ``max_groups`` defaults to the plan's own count."""
        max_groups = plan.num_groups if max_groups is None else max_groups
        if plan.num_groups > max_groups:
            raise ValueError(f"the plan has {plan.num_groups} groups but max_groups is {max_groups}; "
                             "plan with max_groups= to cap it")
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.int32)).to(device)  # noqa: E731
        return cls(to(plan.prefix_len), to(plan.group_rows), to(plan.group_start), max_groups)

    def copy_(self, plan: SharedPrefixPlan) -> None:
        """Overwrite the tensors in place with ``plan`` (static CUDA-graph buffers)."""
        if plan.num_groups > self.max_groups:
            raise ValueError(f"the plan has {plan.num_groups} groups but these buffers were sized "
                             f"for {self.max_groups}; plan with max_groups={self.max_groups}")
        assert plan.prefix_len.shape == tuple(self.prefix_len.shape), "plan sized for another batch"
        for dst, src in ((self.prefix_len, plan.prefix_len), (self.group_rows, plan.group_rows),
                         (self.group_start, plan.group_start)):
            dst.copy_(torch.from_numpy(np.ascontiguousarray(src, np.int32)), non_blocking=False)


def _partials(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
              tables: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, scale: float,
              k_scale: torch.Tensor | None, v_scale: torch.Tensor | None):
    """Unnormalised attention of queries ``q [R, H, D]`` over positions ``[lo, hi)`` of their
    ``tables [R, blocks]``: (acc [R, H, D], max [R, H], sum [R, H]) in fp32; natural exp.
    An FP8 pool is dequantised as it is gathered (``dequantize_kv``, as the plain reference)."""
    num_blocks, block_size, heads, head_dim = key_cache.shape
    rows = q.shape[0]
    width = int((hi - lo).max()) if rows else 0
    if width <= 0:
        return (q.new_zeros(rows, heads, head_dim, dtype=torch.float32),
                q.new_full((rows, heads), float("-inf"), dtype=torch.float32),
                q.new_zeros(rows, heads, dtype=torch.float32))
    pos = lo[:, None] + torch.arange(width, device=q.device)[None, :]    # [R, W]
    valid = pos < hi[:, None]
    col = (pos // block_size).clamp(max=tables.shape[1] - 1)
    block = tables.gather(1, col).clamp(0, num_blocks - 1)
    slot = block * block_size + pos % block_size
    keys = dequantize_kv(key_cache.reshape(-1, heads, head_dim)[slot], k_scale)      # [R, W, H, D]
    values = dequantize_kv(value_cache.reshape(-1, heads, head_dim)[slot], v_scale)
    scores = torch.einsum("rhd,rwhd->rhw", q.float(), keys) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    m = scores.amax(dim=-1)
    p = torch.exp(scores - torch.where(m == float("-inf"), 0.0, m)[..., None])
    return torch.einsum("rhw,rwhd->rhd", p, values), m, p.sum(dim=-1)


def merge_partials(a, b) -> torch.Tensor:
    """Normalised attention from two partials (acc, max, sum) over disjoint key sets."""
    acc_a, m_a, l_a = a
    acc_b, m_b, l_b = b
    m = torch.maximum(m_a, m_b)
    m = torch.where(m == float("-inf"), 0.0, m)
    w_a, w_b = torch.exp(m_a - m), torch.exp(m_b - m)
    total = l_a * w_a + l_b * w_b
    acc = acc_a * w_a[..., None] + acc_b * w_b[..., None]
    return acc / torch.where(total == 0, 1.0, total)[..., None]


def group_leaders(shared: SharedPrefixTensors) -> torch.Tensor:
    """Per row, the first row of its group (itself when in none): whose table the prefix uses."""
    rows = shared.prefix_len.shape[0]
    device = shared.prefix_len.device
    leader = torch.arange(rows, device=device)
    bounds = shared.group_start[1:shared.max_groups + 1].long()
    total = int(shared.group_start[shared.max_groups]) if shared.max_groups else 0
    if total:
        idx = torch.arange(total, device=device)
        group = torch.searchsorted(bounds, idx, right=True)
        members = shared.group_rows[:total].long()
        leader[members] = shared.group_rows[shared.group_start[group].long()].long()
    return leader


def shared_prefix_attention_reference(
    q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
    scale: float, shared: SharedPrefixTensors, num_decodes: int, out: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """Decode rows ``0:num_decodes`` of ``paged_attention`` by the shared-prefix decomposition.

    Each row's prefix partial reads its group leader's block table (as the Triton kernel
    does), its suffix partial its own; the two are merged. Writes ``out`` rows in place.
    FP8 pools are read as ``stored * k_scale`` / ``v_scale`` (``paged_attention_reference``).
    """
    if num_decodes == 0:
        return
    starts = query_start_loc[:num_decodes + 1].long()
    has_query = starts[1:] > starts[:-1]                                 # padding rows have none
    seqs = torch.nonzero(has_query).flatten()
    if seqs.numel() == 0:
        return
    rows = starts[seqs]
    tables = block_tables.long()
    prefix = shared.prefix_len[:num_decodes].long()[seqs]
    lens = seq_lens[:num_decodes].long()[seqs]
    assert bool(((prefix == 0) | (prefix < lens)).all()), \
        "a shared prefix must end before the row's last position"
    leader = group_leaders(shared)[seqs]
    for lo in range(0, seqs.numel(), _CHUNK_ROWS):  # bounds the gathered fp32 K/V on the CPU
        part = slice(lo, lo + _CHUNK_ROWS)
        queries = q[rows[part]]
        pre = _partials(queries, key_cache, value_cache, tables[leader[part]],
                        torch.zeros_like(prefix[part]), prefix[part], scale, k_scale, v_scale)
        suf = _partials(queries, key_cache, value_cache, tables[seqs[part]], prefix[part],
                        lens[part], scale, k_scale, v_scale)
        out[rows[part]] = merge_partials(pre, suf).to(out.dtype)
