"""Plain PyTorch paged attention: the CPU path and the oracle of the Triton kernels.

Layouts (shared with ``triton_paged``):

- KV pool, per layer: ``key_cache`` and ``value_cache`` of shape
  ``[num_blocks, block_size, heads, head_dim]``. Token ``t`` of a sequence lives in block
  ``block_tables[seq, t // block_size]`` at offset ``t % block_size``; its flat *slot* is
  ``block_id * block_size + offset``.
- Varlen batch: the N new tokens of this step, sequence after sequence, as ``[N, heads,
  head_dim]``. ``query_start_loc[S + 1]`` holds the cumulative new-token counts, so sequence
  ``s`` owns rows ``query_start_loc[s]:query_start_loc[s + 1]``.
- ``seq_lens[S]`` is each sequence's whole context *including* this step's new tokens, whose
  K/V must already be in the pool. New tokens sit at the end of the context: new token ``i``
  of a sequence with ``q_len`` new tokens and context ``L`` sees positions ``<= L - q_len + i``.
- Quantised (FP8) pools: a cache of dtype ``torch.float8_e4m3fn`` stores ``x / scale``
  rounded to nearest (saturated at +-448, e4m3's largest finite value) and is read back as
  ``stored * scale``. ``k_scale`` / ``v_scale`` are one-element fp32 tensors on the cache's
  device (the layer's scales); they are read on the device, never by the host, so a CUDA
  graph replays with them. Without scales an FP8 pool uses 1.0.
"""
from __future__ import annotations

import torch

# Bounds the gathered [seqs, context, heads, head_dim] fp32 tensors per chunk of sequences
# (about 256 MiB for K and V together), so large CPU batches do not gather everything at once.
_GATHER_BUDGET_ELEMENTS = 32 * 1024 * 1024

FP8_DTYPES = (torch.float8_e4m3fn,)
FP8_E4M3_MAX = 448.0  # largest finite torch.float8_e4m3fn value


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether a cache of ``dtype`` holds scaled FP8 values (quantised on write)."""
    return dtype in FP8_DTYPES


def quantize_kv(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a cache of ``dtype`` stores it: for FP8, ``x / scale`` in fp32, saturated to
    +-448 and rounded to nearest even; other dtypes are a plain cast (scale must be None)."""
    if not is_fp8(dtype):
        assert scale is None, f"a {dtype} cache takes no scale"
        return x.to(dtype)
    x = x.float()
    if scale is not None:
        x = x / scale.float()
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cache contents back as fp32: ``stored * scale`` (scale None: 1.0)."""
    out = stored.float()
    return out if scale is None else out * scale.float()


def write_kv_reference(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store ``k``/``v`` ``[N, heads, head_dim]`` at ``slot_mapping[N]`` (in place).

    A slot of -1 skips that token (padded rows of CUDA graphs). Uses boolean indexing, which
    syncs with the host on CUDA: the Triton writer is the GPU path. FP8 caches store
    ``quantize_kv(x, scale)``.
    """
    num_blocks, block_size, heads, head_dim = key_cache.shape
    assert value_cache.shape == key_cache.shape
    assert k.shape == v.shape and k.shape[1:] == (heads, head_dim), (k.shape, key_cache.shape)
    assert slot_mapping.shape == (k.shape[0],)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    key_cache.view(num_blocks * block_size, heads, head_dim)[slots] = quantize_kv(k[keep], k_scale, key_cache.dtype)
    value_cache.view(num_blocks * block_size, heads, head_dim)[slots] = quantize_kv(v[keep], v_scale, value_cache.dtype)


def paged_attention_reference(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens over their sequences' paged context.

    q: ``[N, heads, head_dim]``; caches ``[num_blocks, block_size, heads, head_dim]``;
    block_tables ``[S, max_blocks]`` (entries past a sequence's context are never used, any
    value is fine); seq_lens ``[S]``; query_start_loc ``[S + 1]``; scale multiplies q k^T.
    Returns ``[N, heads, head_dim]`` in q's dtype (computed in fp32). A query that sees no
    key (a sequence with ``seq_len == 0``) gets zeros; rows past ``query_start_loc[-1]`` are
    left as they are in ``out`` (zeros when ``out`` is None). An FP8 pool is dequantised
    (``stored * k_scale`` / ``v_scale``) as it is gathered.
    """
    n_tokens, heads, head_dim = q.shape
    num_blocks, block_size = key_cache.shape[:2]
    assert key_cache.shape[2:] == (heads, head_dim) and value_cache.shape == key_cache.shape
    num_seqs = seq_lens.shape[0]
    assert query_start_loc.shape == (num_seqs + 1,) and block_tables.shape[0] == num_seqs
    if out is None:
        out = torch.zeros_like(q)
    assert out.shape == q.shape

    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    assert starts[0] == 0 and starts[-1] <= n_tokens, starts
    for s in range(num_seqs):
        q_len = starts[s + 1] - starts[s]
        assert q_len >= 0 and (lens[s] >= q_len or lens[s] == 0), (s, q_len, lens[s])
        assert lens[s] <= block_tables.shape[1] * block_size, "context longer than its block table"

    q_lens = [starts[s + 1] - starts[s] for s in range(num_seqs)]
    first = 0
    while first < num_seqs:
        # Grow the chunk while its padded gather and its padded scores stay under budget, and
        # while padding every sequence to the chunk's longest query at most doubles the queries:
        # decode rows (one query) batched with a prefill chunk would each be padded to the chunk's
        # length, and their scores with it (a step of 16 decode rows and a 4,096-position chunk
        # computed 17 x 4,096 query rows instead of 4,112).
        last, max_len, max_q, queries = first, 0, 0, 0
        while last < num_seqs:
            width, q_width = max(max_len, lens[last], 1), max(max_q, q_lens[last], 1)
            count = last - first + 1
            if last > first and (count * width * heads * head_dim > _GATHER_BUDGET_ELEMENTS
                                 or count * q_width * width * heads > _GATHER_BUDGET_ELEMENTS
                                 or count * q_width > 2 * (queries + max(q_lens[last], 1))):
                break
            max_len, max_q, queries = width, q_width, queries + max(q_lens[last], 1)
            last += 1
        _attend_chunk(q, key_cache, value_cache, block_tables, starts, lens, first, last,
                      max_len, scale, out, k_scale, v_scale)
        first = last
    return out


def _attend_chunk(q, key_cache, value_cache, block_tables, starts, lens, first, last,
                  max_len, scale, out, k_scale, v_scale) -> None:
    """Sequences ``first:last`` gathered into padded tensors and attended in one batch."""
    device = q.device
    heads, head_dim = q.shape[1:]
    num_blocks, block_size = key_cache.shape[:2]
    count = last - first
    q_lens = [starts[s + 1] - starts[s] for s in range(first, last)]
    max_q = max(q_lens)
    if max_q == 0:
        return
    n_blocks = -(-max_len // block_size)

    # padding entries of the table may hold anything; clamp so the gather stays in bounds
    table = block_tables[first:last, :n_blocks].long().clamp(0, num_blocks - 1)
    keys = key_cache[table].reshape(count, n_blocks * block_size, heads, head_dim)[:, :max_len]
    values = value_cache[table].reshape(count, n_blocks * block_size, heads, head_dim)[:, :max_len]

    q_len_t = torch.tensor(q_lens, device=device)
    seq_len_t = torch.tensor(lens[first:last], device=device)
    start_t = torch.tensor(starts[first:last], device=device)
    offsets = torch.arange(max_q, device=device)
    valid_q = offsets[None, :] < q_len_t[:, None]                        # [count, max_q]
    rows = (start_t[:, None] + offsets[None, :]).clamp(max=q.shape[0] - 1)
    queries = q[rows].float() * valid_q[:, :, None, None]                 # [count, max_q, H, D]

    # new token i sees positions <= seq_len - q_len + i
    last_visible = seq_len_t[:, None] - q_len_t[:, None] + offsets[None, :]
    key_pos = torch.arange(max_len, device=device)
    visible = key_pos[None, None, :] <= last_visible[:, :, None]          # [count, max_q, max_len]

    scores = torch.einsum("bqhd,bkhd->bhqk", queries, dequantize_kv(keys, k_scale)) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)                 # rows seeing no key -> 0
    result = torch.einsum("bhqk,bkhd->bqhd", probs, dequantize_kv(values, v_scale))
    out[rows[valid_q]] = result[valid_q].to(out.dtype)
