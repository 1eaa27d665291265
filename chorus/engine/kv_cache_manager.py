"""Per-request view of the block pool: prefix-cache hits, slot allocation, block tables.

The scheduler drives it in this order for a request:

1. ``get_computed_blocks(request)`` at admission: the longest run of full blocks of the prompt
   (plus any tokens generated before a preemption) already in the cache. The hit never covers
   the last position, whose logits are needed, and for a CFG pair it is the length both rows
   hit (their conditioning blocks are the same blocks, their text blocks are not).
2. ``allocate_slots(request, n, computed)`` makes room for ``n`` more positions per row
   (taking references on the hit blocks first). All rows or none: it returns None and changes
   nothing when the pool is short. ``allocate_next_blocks(seqs, next_positions)`` is the
   decode step's short cut: one block for each row whose next position starts a block.
3. After the model ran, ``cache_computed_blocks(seq)`` registers every block that is now full
   of computed positions, so later requests can hit it. A block becomes findable only after
   the step that filled it has run, so no request ever reads KV still being written.
4. ``free(request)`` drops the request's references, tail blocks first, and resets its rows to
   zero computed positions (finish, abort and preemption all end here).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chorus.engine.block_pool import Block, BlockPool, PoolMetrics, hash_block, root_hash
from chorus.engine.block_tables import BlockTables
from chorus.engine.intmath import cdiv
from chorus.engine.request import Request, Sequence


@dataclass(frozen=True)
class ComputedBlocks:
    """A prefix-cache hit: for each row of a request, the same number of cached blocks."""

    blocks: tuple[tuple[Block, ...], ...]
    block_size: int

    @property
    def num_blocks(self) -> int:
        return len(self.blocks[0]) if self.blocks else 0

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size


class KVCacheManager:
    """Block tables of the sequences in the cache, over one ``BlockPool``."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        self.pool = BlockPool(num_blocks, block_size)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._tables: dict[str, list[Block]] = {}
        self.table_ids = BlockTables()  # block ids of each table, kept in step
        # leading blocks of each table already registered (or tried: a duplicate stays unregistered)
        self._num_cached: dict[str, int] = {}

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def block_table(self, seq_id: str) -> list[int]:
        """Block ids of a sequence, in position order (position p lives in block
        ``table[p // block_size]`` at offset ``p % block_size``)."""
        return self.table_ids.get(seq_id)

    def block_tables(self, seqs: list[Sequence]) -> tuple[np.ndarray, np.ndarray]:
        """The block tables of ``seqs`` (each holding blocks) as one zero-padded
        ``[len(seqs), longest]`` int32 array (a copy), and their lengths."""
        return self.table_ids.gather(s.seq_id for s in seqs)

    def metrics(self) -> PoolMetrics:
        return self.pool.metrics()

    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """The request's cached prefix, capped so that at least the last position (whose logits
        are needed) is computed. Takes no references; pass the result to ``allocate_slots``."""
        assert request.num_computed_tokens == 0, "only a request holding no blocks can hit"
        if not self.enable_prefix_caching:
            return ComputedBlocks(tuple(() for _ in request.sequences), self.block_size)
        hits = []
        for seq in request.sequences:
            max_blocks = (seq.num_tokens - 1) // self.block_size
            hit = []
            for i, block_hash in enumerate(self._hashes(seq, max_blocks)):
                block = self.pool.get_cached_block(block_hash, self._parent(seq, i), self._keys(seq, i))
                if block is None:
                    break
                hit.append(block)
            hits.append(hit)
        common = min(len(h) for h in hits)
        return ComputedBlocks(tuple(tuple(h[:common]) for h in hits), self.block_size)

    # -- allocation ----------------------------------------------------------------------------
    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks | None = None
    ) -> list[list[int]] | None:
        """Make room in every row for ``num_new_tokens`` positions after the computed ones (the
        ``computed`` hit, if given, counts as computed and is taken first).

        Returns the ids of the newly allocated blocks per row, or None when the pool cannot
        serve all rows; then nothing changed."""
        assert num_new_tokens >= 0
        hits = computed.blocks if computed is not None else tuple(() for _ in request.sequences)
        assert len(hits) == request.num_rows
        needed = 0
        for seq, hit in zip(request.sequences, hits):
            table = self._tables.get(seq.seq_id, [])
            assert not (hit and table), "a hit is only for a request holding no blocks"
            end = seq.num_computed_tokens + len(hit) * self.block_size + num_new_tokens
            assert end <= seq.num_tokens, f"{seq}: cannot compute {end} positions"
            needed += max(0, self.num_blocks_for(end) - len(table) - len(hit))
        # hit blocks nobody references still sit in the free list: taking them costs free blocks
        reviving = {b.block_id for hit in hits for b in hit if b.ref_count == 0}
        if needed + len(reviving) > self.pool.num_free_blocks:
            return None
        for hit in hits:  # every row's hits before any allocation, so none is evicted under us
            self.pool.touch(hit)
        new_ids = []
        for seq, hit in zip(request.sequences, hits):
            table = self._tables.setdefault(seq.seq_id, [])
            if hit:
                table.extend(hit)
                self.table_ids.extend(seq.seq_id, [b.block_id for b in hit])
                self._num_cached[seq.seq_id] = len(hit)
                seq.num_computed_tokens += len(hit) * self.block_size
            end = seq.num_computed_tokens + num_new_tokens
            new = self.pool.allocate(max(0, self.num_blocks_for(end) - len(table)))
            assert new is not None
            table.extend(new)
            new_ids.append([b.block_id for b in new])
            self.table_ids.extend(seq.seq_id, new_ids[-1])
        if computed is not None:
            self.pool.record_prefix_lookup(
                sum(s.num_tokens for s in request.sequences), computed.num_tokens * request.num_rows,
            )
        return new_ids

    def allocate_next_blocks(self, seqs: list[Sequence], next_positions: list[int]) -> bool:
        """Append one new block to each of ``seqs``' tables, in order: the decode fast path,
        for rows whose table covers exactly the positions before their next one and whose
        next position starts a block. ``next_positions``: per row, its computed positions, plus
        the positions in flight for a step scheduled ahead.
        All or nothing: False, and nothing changed, when the pool is short."""
        assert len(next_positions) == len(seqs)
        blocks = self.pool.allocate(len(seqs))
        if blocks is None:
            return False
        for seq, block, position in zip(seqs, blocks, next_positions):
            table = self._tables[seq.seq_id]
            assert len(table) * self.block_size == position >= seq.num_computed_tokens, seq
            table.append(block)
            self.table_ids.extend(seq.seq_id, [block.block_id])
        return True

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the sequence's blocks that are full of computed positions (call after the
        step that computed them)."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        start = self._num_cached.get(seq.seq_id, 0)
        if num_full <= start:
            return  # no block became full this step (the common decode case)
        table = self._tables[seq.seq_id]
        assert num_full <= len(table)
        self._extend_chain(seq, start)
        hashes = seq.block_hashes
        for i in range(start, num_full):
            keys, parent = self._keys(seq, i), self._parent(seq, i)
            if i == len(hashes):  # extend the chain here, so the keys are built once per block
                hashes.append(hash_block(parent, keys))
            block = table[i]
            if block.block_hash is None:
                self.pool.cache_block(block, hashes[i], parent, keys)
            else:
                assert block.block_hash == hashes[i], f"{seq}: block {i} changed content"
        self._num_cached[seq.seq_id] = num_full

    def free(self, request: Request) -> None:
        """Drop all of the request's blocks (tail blocks first, so shared prefixes are evicted
        last) and reset its rows to zero computed positions."""
        for seq in reversed(request.sequences):
            table = self._tables.pop(seq.seq_id, [])
            self.table_ids.remove(seq.seq_id)
            self._num_cached.pop(seq.seq_id, None)
            self.pool.free(reversed(table))
            seq.num_computed_tokens = 0

    # -- invariants ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every reference is accounted for by a block table, and every table covers its
        sequence's computed positions."""
        self.pool.check_invariants()
        refs: dict[int, int] = {}
        for table in self._tables.values():
            for block in table:
                refs[block.block_id] = refs.get(block.block_id, 0) + 1
        for block in self.pool.blocks:
            assert block.ref_count == refs.get(block.block_id, 0), block
        for seq_id, table in self._tables.items():
            assert self.table_ids.get(seq_id) == [b.block_id for b in table], seq_id
        assert int(self.table_ids.lengths.sum()) == sum(len(t) for t in self._tables.values())

    def check_sequence(self, seq: Sequence) -> None:
        table = self._tables.get(seq.seq_id, [])
        assert len(table) * self.block_size >= seq.num_computed_tokens, seq

    # -- hashing -------------------------------------------------------------------------------
    def _keys(self, seq: Sequence, i: int) -> list[int]:
        return seq.keys_between(i * self.block_size, (i + 1) * self.block_size)

    def _parent(self, seq: Sequence, i: int) -> bytes:
        return seq.block_hashes[i - 1] if i > 0 else root_hash(seq.cond_key)

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The first ``num_blocks`` block hashes of ``seq`` (memoised on the sequence)."""
        self._extend_chain(seq, num_blocks)
        return seq.block_hashes[:num_blocks]

    def _extend_chain(self, seq: Sequence, num_blocks: int) -> None:
        """Memoise the hashes of the first ``num_blocks`` blocks on the sequence."""
        assert num_blocks * self.block_size <= seq.num_tokens
        while len(seq.block_hashes) < num_blocks:
            i = len(seq.block_hashes)
            seq.block_hashes.append(hash_block(self._parent(seq, i), self._keys(seq, i)))
