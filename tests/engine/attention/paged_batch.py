"""Random paged-attention batches with their dense (contiguous) K/V, shared by the tests."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chorus.engine.attention import write_kv_reference


@dataclass
class PagedBatch:
    q: torch.Tensor                 # [N, H, D]
    new_k: torch.Tensor             # [N, H, D] K of the new tokens (already in the cache)
    new_v: torch.Tensor
    key_cache: torch.Tensor         # [num_blocks, block_size, H, D]
    value_cache: torch.Tensor
    block_tables: torch.Tensor      # [S, max_blocks] int32; padding entries are out of range
    seq_lens: torch.Tensor          # [S] int32
    query_start_loc: torch.Tensor   # [S + 1] int32
    slot_mapping: torch.Tensor      # [N] int64, slots of the new tokens (-1: padding sequence)
    dense_k: list[torch.Tensor]     # per sequence [seq_len, H, D]
    dense_v: list[torch.Tensor]
    q_lens: list[int]
    scale: float

    @property
    def max_query_len(self) -> int:
        return max(self.q_lens)

    def args(self) -> tuple:
        """Positional arguments of ``paged_attention``."""
        return (self.q, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, self.scale)


def make_batch(
    specs: list[tuple[int, int]], *, heads: int = 2, head_dim: int = 64, block_size: int = 16,
    dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0,
    spare_blocks: int = 5, table_slack: int = 2,
) -> PagedBatch:
    """One sequence per ``(seq_len, q_len)`` spec, its blocks scattered over a shuffled pool.

    The last ``q_len`` positions of each sequence are its new tokens; ``(0, q_len)`` is a
    padding sequence (no context, slots -1). Padding entries of the block table hold
    out-of-range block ids, so a kernel that read one would fail or show it. Unused pool slots
    hold random values, never zeros.
    """
    assert specs and all(0 <= q <= n or (n == 0 and q >= 0) for n, q in specs), specs
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    need = [-(-seq_len // block_size) for seq_len, _ in specs]
    num_blocks = sum(need) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.randint(num_blocks, 10 * num_blocks + 7, (len(specs), max(need) + table_slack),
                          generator=gen)
    key_cache = randn(num_blocks, block_size, heads, head_dim)
    value_cache = randn(num_blocks, block_size, heads, head_dim)

    dense_k, dense_v, new_k, new_v, new_slots = [], [], [], [], []
    used = 0
    for s, (seq_len, q_len) in enumerate(specs):
        blocks = torch.tensor(order[used:used + need[s]], dtype=torch.int64)
        used += need[s]
        table[s, :need[s]] = blocks
        pos = torch.arange(seq_len)
        slots = blocks[pos // block_size] * block_size + pos % block_size
        k, v = randn(seq_len, heads, head_dim), randn(seq_len, heads, head_dim)
        write_kv_reference(key_cache, value_cache, k, v, slots)
        dense_k.append(k)
        dense_v.append(v)
        if seq_len == 0:
            new_k.append(randn(q_len, heads, head_dim))
            new_v.append(randn(q_len, heads, head_dim))
            new_slots.append(torch.full((q_len,), -1, dtype=torch.int64))
        else:
            new_k.append(k[seq_len - q_len:])
            new_v.append(v[seq_len - q_len:])
            new_slots.append(slots[seq_len - q_len:])

    q_lens = [q for _, q in specs]
    starts = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    return PagedBatch(
        q=randn(sum(q_lens), heads, head_dim).to(device),
        new_k=torch.cat(new_k).to(device), new_v=torch.cat(new_v).to(device),
        key_cache=key_cache.to(device), value_cache=value_cache.to(device),
        block_tables=table.to(torch.int32).to(device),
        seq_lens=torch.tensor([n for n, _ in specs], dtype=torch.int32).to(device),
        query_start_loc=starts.to(device), slot_mapping=torch.cat(new_slots).to(device),
        dense_k=dense_k, dense_v=dense_v, q_lens=q_lens, scale=head_dim ** -0.5,
    )


def dense_attention(batch: PagedBatch) -> torch.Tensor:
    """SDPA over each sequence's contiguous K/V, in float64 on the CPU: the ground truth."""
    q = batch.q.cpu().double()
    out = torch.zeros_like(q)
    starts = batch.query_start_loc.tolist()
    for s, q_len in enumerate(batch.q_lens):
        seq_len = len(batch.dense_k[s])
        if q_len == 0 or seq_len == 0:
            continue
        qs = q[starts[s]:starts[s + 1]].transpose(0, 1)           # [H, q_len, D]
        ks = batch.dense_k[s].double().transpose(0, 1)             # [H, seq_len, D]
        vs = batch.dense_v[s].double().transpose(0, 1)
        visible = torch.arange(seq_len)[None, :] <= (seq_len - q_len + torch.arange(q_len))[:, None]
        res = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=visible, scale=batch.scale)
        out[starts[s]:starts[s + 1]] = res.transpose(0, 1)
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; any NaN or inf in ``out`` gives inf."""
    out, ref = out.detach().cpu().double(), ref.detach().cpu().double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# (seq_len, q_len) per sequence; block-size dependent cases are built in ``scenario``
SCENARIOS = ("decode", "prefill", "chunked", "mixed", "boundaries", "padding_seq")


def scenario(name: str, block_size: int) -> list[tuple[int, int]]:
    """Named batch shapes shared by the reference, interpreter and GPU tests."""
    bs = block_size
    return {
        "decode": [(37, 1), (1, 1), (bs, 1), (bs + 1, 1), (3 * bs + 5, 1), (100, 1)],
        "prefill": [(20, 20), (2 * bs + 1, 2 * bs + 1), (1, 1), (bs, bs)],
        # a cached prefix plus a new chunk that starts mid-block and crosses block boundaries
        "chunked": [(50, 17), (4 * bs, bs), (bs + 3, 6)],
        "mixed": [(37, 1), (20, 20), (50, 17), (bs, 1), (9, 1), (2 * bs + 2, 3)],
        "boundaries": [(bs, 1), (bs + 1, 1), (2 * bs - 1, 2), (2 * bs, bs + 1), (bs - 1, bs - 1)],
        "padding_seq": [(37, 1), (0, 1), (20, 4), (0, 1)],
    }[name]


def capture_step_checking_no_sync(step) -> torch.cuda.CUDAGraph:
    """Run a decode ``step`` once (compiling), again with host syncs made errors, then capture
    it in a CUDA graph."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def advance_decode(batch: PagedBatch, slots: torch.Tensor, seq_lens: torch.Tensor, *fresh: torch.Tensor) -> None:
    """The next decode step in place: every real sequence grows by one token (its slot in an
    allocated block), padding sequences stay empty, and ``fresh`` tensors get new values."""
    block_size = batch.key_cache.shape[1]
    real = seq_lens > 0
    pos = seq_lens.long()
    new_slots = batch.block_tables.long().gather(1, (pos // block_size)[:, None])[:, 0] * block_size + pos % block_size
    slots.copy_(torch.where(real, new_slots, -1))
    seq_lens.copy_(torch.where(real, seq_lens + 1, 0))
    for t in fresh:
        t.copy_(torch.randn_like(t))
