"""BlockPool: ref counts, LRU free list with lazy eviction, chained hashes, metrics."""
import subprocess
import sys
from pathlib import Path

import pytest

from chorus.engine.block_pool import BlockPool, hash_block, root_hash

BS = 4
KEYS = (1, 2, 3, 4)


def _cached_block(pool, keys=KEYS, parent=None):
    parent = parent or root_hash(b"voice")
    (block,) = pool.allocate(1)
    h = hash_block(parent, keys)
    assert pool.cache_block(block, h, parent, keys)
    return block, h, parent


def test_allocate_gives_blocks_with_one_reference():
    pool = BlockPool(4, BS)
    blocks = pool.allocate(3)
    assert [b.ref_count for b in blocks] == [1, 1, 1]
    assert pool.num_free_blocks == 1 and pool.num_used_blocks == 3


def test_allocate_returns_none_when_short_and_changes_nothing():
    pool = BlockPool(2, BS)
    assert pool.allocate(3) is None
    assert pool.num_free_blocks == 2


def test_shared_block_stays_used_until_last_reference_is_freed():
    pool = BlockPool(2, BS)
    (block,) = pool.allocate(1)
    pool.touch([block])
    pool.free([block])
    assert block.ref_count == 1 and block.block_id not in pool.free_block_ids()
    pool.free([block])
    assert block.ref_count == 0 and block.block_id in pool.free_block_ids()


def test_free_appends_to_lru_tail_in_given_order():
    pool = BlockPool(4, BS)
    blocks = pool.allocate(4)
    pool.free([blocks[2], blocks[0], blocks[3], blocks[1]])
    assert pool.free_block_ids() == [2, 0, 3, 1]


def test_allocate_takes_least_recently_freed_first():
    pool = BlockPool(3, BS)
    a, b, c = pool.allocate(3)
    pool.free([c])
    pool.free([a])
    assert [blk.block_id for blk in pool.allocate(2)] == [c.block_id, a.block_id]


def test_freed_block_keeps_its_hash_and_stays_findable():
    pool = BlockPool(2, BS)
    block, h, parent = _cached_block(pool)
    pool.free([block])
    assert block.block_hash == h
    assert pool.get_cached_block(h, parent, KEYS) is block


def test_touching_a_cached_free_block_takes_it_off_the_free_list():
    pool = BlockPool(2, BS)
    block, h, parent = _cached_block(pool)
    pool.free([block])
    pool.touch([pool.get_cached_block(h, parent, KEYS)])
    assert block.ref_count == 1 and block.block_id not in pool.free_block_ids()
    assert block.block_hash == h


def test_reusing_a_cached_block_evicts_its_hash():
    pool = BlockPool(1, BS)
    block, h, parent = _cached_block(pool)
    pool.free([block])
    (again,) = pool.allocate(1)
    assert again is block and block.block_hash is None
    assert pool.get_cached_block(h, parent, KEYS) is None
    assert pool.metrics().evictions == 1


def test_hash_is_stable_across_processes():
    code = ("from chorus.engine.block_pool import hash_block, root_hash;"
            "print(hash_block(root_hash(b'voice'), [1, 2, 3, 4]).hex())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2])
    assert other.stdout.strip() == hash_block(root_hash(b"voice"), KEYS).hex()


def test_hash_chains_through_the_parent():
    a, b = root_hash(b"voice-a"), root_hash(b"voice-b")
    assert hash_block(a, KEYS) != hash_block(b, KEYS)
    assert hash_block(hash_block(a, KEYS), KEYS) != hash_block(a, KEYS)


def test_lookup_verifies_keys_and_parent_not_just_the_digest():
    pool = BlockPool(2, BS)
    _, h, parent = _cached_block(pool)
    assert pool.get_cached_block(h, parent, (9, 9, 9, 9)) is None
    assert pool.get_cached_block(h, root_hash(b"other"), KEYS) is None


def test_second_block_with_the_same_hash_stays_unregistered():
    pool = BlockPool(2, BS)
    first, h, parent = _cached_block(pool)
    (second,) = pool.allocate(1)
    assert not pool.cache_block(second, h, parent, KEYS)
    assert second.block_hash is None and pool.get_cached_block(h, parent, KEYS) is first
    pool.check_invariants()


def test_double_free_is_an_invariant_violation():
    pool = BlockPool(1, BS)
    blocks = pool.allocate(1)
    pool.free(blocks)
    with pytest.raises(AssertionError):
        pool.free(blocks)


def test_metrics_report_usage_and_prefix_hit_rate():
    pool = BlockPool(4, BS)
    block, _, _ = _cached_block(pool)
    pool.allocate(1)
    pool.free([block])
    pool.record_prefix_lookup(queried_tokens=40, hit_tokens=10)
    m = pool.metrics()
    assert (m.num_used_blocks, m.num_free_blocks, m.num_cached_free_blocks) == (1, 3, 1)
    assert m.usage == 0.25 and m.prefix_hit_rate == 0.25


def test_reset_prefix_cache_drops_only_free_blocks_hashes():
    pool = BlockPool(2, BS)
    free_block, _, _ = _cached_block(pool)
    used_block, _, _ = _cached_block(pool, keys=(5, 6, 7, 8))
    pool.free([free_block])
    assert pool.reset_prefix_cache() == 1
    assert free_block.block_hash is None and used_block.block_hash is not None
    pool.check_invariants()
