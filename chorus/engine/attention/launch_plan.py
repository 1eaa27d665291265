"""Which Triton kernel variants one attention call launches: the host-side choices, in one place.

A Triton kernel compiles once per combination of its constexpr values and launch options (the
other arguments of ours are marked so that their values do not split it: see
``triton_paged.py``). For paged attention those combinations are the query-block size
(``BLOCK_Q``: 1 for the decode kernel, 16 or 64 for the query-block kernel), the KV split count
(``NUM_SPLITS``) and whether a decode launch skips a shared prefix (``KV_START``); the
shared-prefix path adds its group tile (``BLOCK_G``) and prefix split count. This module owns
those choices: ``plan_attention`` is what ``paged_attention_triton`` launches, and
``reachable_launches`` enumerates every plan it can pick for steps within an engine's limits,
from the same functions, so that the engine can compile them all before serving
(``chorus.engine.warmup``).

No Triton import: the engine enumerates plans without loading the kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chorus.engine.intmath import cdiv, next_power_of_2

MAX_SPLITS = 16
MAX_PREFIX_SPLITS = 4  # each prefix split costs a fp32 partial per (row, head): keep the merge cheap
DEFAULT_TILE = 64  # keys per loop iteration of the decode, query-block and prefix kernels


_sm_counts: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors the split choice sizes for (4 off CUDA: interpreter runs stay
    small, so that tests still see split-KV chosen)."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_counts[index]


def choose_num_splits(programs: int, max_tiles: int, num_sms: int) -> int:
    """KV splits per (query block, head): enough programs for ~4 per SM, none of them empty.

    Depends only on host-side sizes, so a CUDA graph captured for a batch bucket keeps one
    choice; any choice is correct (empty splits contribute nothing).
    """
    target = 4 * num_sms
    if programs >= target or max_tiles <= 1:
        return 1
    want = next_power_of_2(cdiv(target, programs))
    floor_tiles = 1 << (max_tiles.bit_length() - 1)  # largest power of 2 <= max_tiles
    return max(1, min(want, floor_tiles, MAX_SPLITS))


def query_block_size(max_query_len: int) -> int:
    """``BLOCK_Q`` of the query-block kernel for a batch whose longest row has
    ``max_query_len`` new tokens (> 1)."""
    return 16 if max_query_len <= 16 else 64


def query_blocks(block_q: int, num_seqs: int, row_count: int) -> int:
    """Programs along the grid's first axis for ``num_seqs`` sequences with ``row_count`` new
    tokens in all (see ``triton_paged``: each sequence owns at least ``cdiv(q_len, BLOCK_Q)``)."""
    return num_seqs if block_q == 1 else row_count // block_q + num_seqs


def choose_block_g(num_decodes: int) -> int:
    """Queries per prefix program: 16 (the smallest tensor-core tile) up to 64 for big batches."""
    return max(16, min(64, next_power_of_2(max(num_decodes, 1) // 4)))


def choose_prefix_splits(num_decodes: int, heads: int, block_g: int, max_prefix_tiles: int,
                         num_sms: int) -> int:
    """Prefix splits per group tile, sized as if the decode rows formed one group (the case
    that leaves the GPU emptiest); host-side sizes only, so fixed for a captured graph."""
    tiles = cdiv(max(num_decodes, 1), block_g)
    return min(MAX_PREFIX_SPLITS, choose_num_splits(tiles * heads, max_prefix_tiles, num_sms))


@dataclass(frozen=True)
class PagedLaunch:
    """One launch of ``_paged_attention_kernel`` (and, with ``num_splits > 1`` and no
    ``kv_start``, of ``_reduce_splits_kernel``): the choices its variant depends on."""

    block_q: int  # 1: the decode kernel
    num_splits: int
    kv_start: bool = False  # decode rows skipping their shared prefix (the shared path's suffix)


@dataclass(frozen=True)
class SharedLaunch:
    """The shared-prefix path's launches for the decode rows: the suffix (a ``PagedLaunch``
    with ``kv_start``), ``_prefix_kernel`` and ``_merge_kernel``."""

    suffix_splits: int
    block_g: int
    prefix_splits: int

    @property
    def suffix(self) -> PagedLaunch:
        return PagedLaunch(block_q=1, num_splits=self.suffix_splits, kv_start=True)


@dataclass(frozen=True)
class AttentionPlan:
    """The launches of one ``paged_attention_triton`` call (None: that part launches nothing);
    ``num_decodes``: the leading rows the decode (or shared) part takes."""

    num_decodes: int
    decode: PagedLaunch | None
    shared: SharedLaunch | None
    query_block: PagedLaunch | None

    def launches(self) -> list[PagedLaunch | SharedLaunch]:
        return [p for p in (self.decode, self.shared, self.query_block) if p is not None]


def plan_decode(num_decodes: int, heads: int, max_seq_len: int, num_sms: int, *, tile: int = DEFAULT_TILE,
                num_splits: int | None = None, kv_start: bool = False) -> PagedLaunch:
    """The decode kernel's launch over ``num_decodes`` one-token rows."""
    return _paged_launch(1, num_decodes, heads, max_seq_len, num_sms, tile, num_splits, kv_start)


def plan_query_block(num_seqs: int, row_count: int, max_query_len: int, heads: int, max_seq_len: int,
                     num_sms: int, *, tile: int = DEFAULT_TILE, num_splits: int | None = None) -> PagedLaunch:
    """The query-block kernel's launch over ``num_seqs`` rows with ``row_count`` new tokens."""
    block_q = query_block_size(max_query_len)
    return _paged_launch(block_q, query_blocks(block_q, num_seqs, row_count), heads, max_seq_len, num_sms, tile,
                         num_splits)


def _paged_launch(block_q: int, q_blocks: int, heads: int, max_seq_len: int, num_sms: int, tile: int,
                  num_splits: int | None, kv_start: bool = False) -> PagedLaunch:
    if num_splits is None:
        num_splits = choose_num_splits(q_blocks * heads, cdiv(max_seq_len, tile), num_sms)
    return PagedLaunch(block_q=block_q, num_splits=num_splits, kv_start=kv_start)


def plan_shared(num_decodes: int, heads: int, max_seq_len: int, num_sms: int, *, decode_tile: int = DEFAULT_TILE,
                prefix_tile: int = DEFAULT_TILE, num_splits: int | None = None, block_g: int | None = None,
                prefix_splits: int | None = None) -> SharedLaunch:
    """The shared-prefix path's launches over ``num_decodes`` decode rows."""
    suffix = plan_decode(num_decodes, heads, max_seq_len, num_sms, tile=decode_tile, num_splits=num_splits,
                         kv_start=True)
    block_g = choose_block_g(num_decodes) if block_g is None else block_g
    if prefix_splits is None:
        prefix_splits = choose_prefix_splits(num_decodes, heads, block_g, cdiv(max_seq_len, prefix_tile), num_sms)
    return SharedLaunch(suffix_splits=suffix.num_splits, block_g=block_g, prefix_splits=prefix_splits)


def plan_attention(num_seqs: int, n_tokens: int, max_query_len: int, num_decodes: int, max_seq_len: int,
                   heads: int, num_sms: int, *, shared: bool = False, decode_tile: int = DEFAULT_TILE,
                   prefill_tile: int = DEFAULT_TILE, num_splits: int | None = None) -> AttentionPlan:
    """What ``paged_attention_triton`` launches for a batch of ``num_seqs`` rows and ``n_tokens``
    new tokens whose first ``num_decodes`` rows have one new token each (all of them when
    ``max_query_len <= 1``); ``shared``: the decode rows take the shared-prefix path."""
    if max_query_len <= 1:
        num_decodes = num_seqs
    assert 0 <= num_decodes <= num_seqs, (num_decodes, num_seqs)
    decode = shared_launch = query_block = None
    if num_decodes > 0 and shared:
        shared_launch = plan_shared(num_decodes, heads, max_seq_len, num_sms, decode_tile=decode_tile,
                                    num_splits=num_splits)
    elif num_decodes > 0:
        decode = plan_decode(num_decodes, heads, max_seq_len, num_sms, tile=decode_tile, num_splits=num_splits)
    if num_decodes < num_seqs:
        query_block = plan_query_block(num_seqs - num_decodes, n_tokens - num_decodes, max_query_len, heads,
                                       max_seq_len, num_sms, tile=prefill_tile, num_splits=num_splits)
    return AttentionPlan(num_decodes=num_decodes, decode=decode, shared=shared_launch, query_block=query_block)


# ------------------------------------------------------------------------------ enumeration
@dataclass(frozen=True)
class StepLimits:
    """Bounds of every step an engine schedules: rows, new tokens and context per row.

    shared_prefix_min_rows: decode rows from which a step may take the shared-prefix path
    (None: never).
    """

    max_rows: int
    max_tokens: int
    max_seq_len: int
    shared_prefix_min_rows: int | None = None


def _seq_len_points(max_seq_len: int, tiles: tuple[int, ...]) -> list[int]:
    """One context length per interval on which every ``cdiv(max_seq_len, tile)`` is constant:
    each interval's right end (the choices read the context only through those counts)."""
    points = {max_seq_len}
    for tile in tiles:
        points.update(range(tile, max_seq_len, tile))
    return sorted(points)


def reachable_launches(limits: StepLimits, heads: int, num_sms: int) -> set[PagedLaunch | SharedLaunch]:
    """Every launch ``plan_attention`` (default tiles) picks for some step within ``limits``:
    decode launches over 1 .. max_rows rows, query-block launches for every block size and
    program count that up to max_rows rows and max_tokens tokens make, shared-prefix launches
    from ``shared_prefix_min_rows`` decode rows; each at every context up to max_seq_len.
    A superset where the sizes combine more freely than a scheduler can (a few unused variants
    at most), never a subset: ``tests/engine/test_warmup.py`` checks it against swept batches."""
    rows, tokens = limits.max_rows, limits.max_tokens
    seq_lens = _seq_len_points(limits.max_seq_len, (DEFAULT_TILE,))
    found: set[PagedLaunch | SharedLaunch] = set()
    for max_seq_len in seq_lens:
        for num_decodes in range(1, rows + 1):
            found.add(plan_decode(num_decodes, heads, max_seq_len, num_sms))
            if limits.shared_prefix_min_rows is not None and num_decodes >= limits.shared_prefix_min_rows:
                found.add(plan_shared(num_decodes, heads, max_seq_len, num_sms))
        longest = min(tokens, max_seq_len)  # new tokens of one row
        for block_q in sorted({query_block_size(q) for q in range(2, longest + 1)}):
            for q_blocks in range(1, query_blocks(block_q, rows, tokens) + 1):
                found.add(_paged_launch(block_q, q_blocks, heads, max_seq_len, num_sms, DEFAULT_TILE, None))
    return found
