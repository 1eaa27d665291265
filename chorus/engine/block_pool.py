"""A fixed pool of KV-cache blocks: ref counts, an LRU free list and the prefix-cache map.

A block holds the keys and values of ``block_size`` consecutive positions of one sequence (the
tensors live in the model runner; this module only hands out block ids). A block is in exactly
one of three states:

- **used**: ``ref_count > 0``; one or more sequences' block tables point at it.
- **free and cached**: ``ref_count == 0`` but it still carries its hash, so a later request
  with the same prefix can take it back (``touch``) without recomputing it.
- **free**: ``ref_count == 0`` and no hash.

Free blocks (cached or not) sit in one LRU queue. ``allocate`` takes from the head (least
recently freed); only at that moment does a cached block lose its hash ("lazy eviction").
``free`` appends to the tail in the order given, so a caller frees a sequence's blocks tail
first: the prefix blocks, the ones most likely to be shared, are evicted last.

Hashes are chained: a full block's hash covers its parent's hash and its own position keys
(see ``hash_block``), so equal hashes mean equal whole prefixes. They come from blake2b and are
stable across processes and Python versions. A lookup also compares the stored parent hash and
keys, so a digest collision can never hand out a block with different content.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BlockHash = bytes
_DIGEST_BYTES = 32


def root_hash(cond_key: bytes) -> BlockHash:
    """Seed of a sequence's hash chain: the key of its conditioning (voice, exaggeration,
    variant). Every block hash of the sequence depends on it."""
    return hashlib.blake2b(cond_key, digest_size=_DIGEST_BYTES, person=b"chorus.kv.root").digest()


def hash_block(parent: BlockHash, keys: Sequence[int]) -> BlockHash:
    """Hash of one full block: its parent's hash plus its position keys (unsigned 64-bit ints,
    see ``chorus.engine.request.position_key``), packed little-endian."""
    h = hashlib.blake2b(parent, digest_size=_DIGEST_BYTES, person=b"chorus.kv.block")
    h.update(struct.pack(f"<{len(keys)}Q", *keys))
    return h.digest()


class Block:
    """One block of the pool. ``block_hash``/``parent_hash``/``keys`` are set only while the
    block is registered in the prefix cache."""

    __slots__ = ("block_id", "ref_count", "block_hash", "parent_hash", "keys")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: BlockHash | None = None
        self.parent_hash: BlockHash | None = None
        self.keys: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else f", hash={self.block_hash[:4].hex()}"
        return f"Block({self.block_id}, ref={self.ref_count}{cached})"


@dataclass(frozen=True)
class PoolMetrics:
    """A snapshot of the pool's gauges and counters (for /metrics and logs).

    ``prefix_queried_tokens``/``prefix_hit_tokens`` count prompt positions looked up at
    admission and positions served from the cache; ``evictions`` counts cached blocks that lost
    their hash because they were reused."""

    num_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_free_blocks: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    evictions: int

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_queried_tokens
        return self.prefix_hit_tokens / q if q else 0.0


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` positions each, with ref counts, an O(1) LRU
    free list and the hash -> block map of the prefix cache.

    Invariant: ``block.block_hash is not None`` if and only if the map sends that hash to that
    very block (the first block registered under a hash wins; a duplicate stays unregistered).
    """

    def __init__(self, num_blocks: int, block_size: int):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # insertion order is LRU order: the head is evicted first
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, Block] = {}
        self._queried_tokens = 0
        self._hit_tokens = 0
        self._evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that ``allocate`` may hand out, cached ones included."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    def allocate(self, n: int) -> list[Block] | None:
        """Take ``n`` blocks from the LRU head, each with ``ref_count == 1``, evicting any hash
        they still carry. Returns None (and changes nothing) if fewer than ``n`` are free."""
        assert n >= 0
        if n > len(self._free):
            return None
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            assert block.ref_count == 0, block
            self._evict(block)
            block.ref_count = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take one more reference on each block (a prefix-cache hit); a free block leaves the
        free list and keeps its hash."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference on each block; blocks reaching zero join the LRU tail in the
        given order (pass a sequence's blocks tail first so its prefix is evicted last)."""
        for block in blocks:
            assert block.ref_count > 0, f"double free of {block}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None

    def cache_block(
        self, block: Block, block_hash: BlockHash, parent_hash: BlockHash, keys: Sequence[int]
    ) -> bool:
        """Register a full, computed block under ``block_hash``. Returns False (and leaves the
        block unregistered) if another block already holds that hash."""
        assert block.ref_count > 0 and block.block_hash is None, block
        assert len(keys) == self.block_size
        if block_hash in self._cached:
            return False
        block.block_hash, block.parent_hash, block.keys = block_hash, parent_hash, tuple(keys)
        self._cached[block_hash] = block
        return True

    def get_cached_block(
        self, block_hash: BlockHash, parent_hash: BlockHash, keys: Sequence[int]
    ) -> Block | None:
        """The block registered under ``block_hash`` if its parent hash and keys match too,
        else None. Does not take a reference (see ``touch``)."""
        block = self._cached.get(block_hash)
        if block is None or block.parent_hash != parent_hash or block.keys != tuple(keys):
            return None
        return block

    def record_prefix_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        """Count one admission's prefix lookup (for the hit-rate metric)."""
        assert 0 <= hit_tokens <= queried_tokens
        self._queried_tokens += queried_tokens
        self._hit_tokens += hit_tokens

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free blocks (used blocks keep theirs). Returns how many."""
        dropped = 0
        for block_id in self._free:
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._evict(block)
                dropped += 1
        return dropped

    def metrics(self) -> PoolMetrics:
        cached_free = sum(1 for i in self._free if self.blocks[i].block_hash is not None)
        return PoolMetrics(
            num_blocks=self.num_blocks, num_used_blocks=self.num_used_blocks,
            num_free_blocks=self.num_free_blocks, num_cached_free_blocks=cached_free,
            prefix_queried_tokens=self._queried_tokens, prefix_hit_tokens=self._hit_tokens,
            evictions=self._evictions,
        )

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (head first); for tests and debugging."""
        return list(self._free)

    def check_invariants(self) -> None:
        """Assert the pool's internal consistency (cheap enough to call every step in tests)."""
        for block in self.blocks:
            assert block.ref_count >= 0, block
            assert (block.ref_count == 0) == (block.block_id in self._free), block
            if block.block_hash is not None:
                assert self._cached.get(block.block_hash) is block, block
        for block_hash, block in self._cached.items():
            assert block.block_hash == block_hash, block

    def _evict(self, block: Block) -> None:
        if block.block_hash is None:
            return
        del self._cached[block.block_hash]
        block.block_hash = block.parent_hash = block.keys = None
        self._evictions += 1
