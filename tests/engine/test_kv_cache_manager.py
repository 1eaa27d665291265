"""KVCacheManager: prefix hits keyed by conditioning and CFG branch, allocation, decode, free."""
import pytest

from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.request import Request, T3Prompt, conditioning_key

BS = 16
BOS, EOS = 6561, 6562
COND_LEN = 34  # original/multilingual: blocks 0-1 are pure conditioning, block 2 starts the text


def make_request(rid, text=tuple(range(10, 40)), *, cfg=False, voice="voice-a", exaggeration=0.5,
                 variant="original", cond_len=COND_LEN):
    prompt = T3Prompt(cond_key=conditioning_key(variant, voice, exaggeration), cond_len=cond_len,
                      text_ids=tuple(text), bos_token=BOS, eos_token=EOS, bos_copies=2, cfg=cfg)
    return Request(rid, prompt, max_tokens=50)


def compute(kv, request, n=None, computed=None):
    """Allocate and 'run' n positions per row (default: the rest of the sequence)."""
    if n is None:
        n = request.num_tokens - request.num_computed_tokens - (computed.num_tokens if computed else 0)
    assert kv.allocate_slots(request, n, computed) is not None
    for seq in request.sequences:
        seq.num_computed_tokens += n
        kv.cache_computed_blocks(seq)


def prefill_and_free(kv, request):
    compute(kv, request)
    kv.free(request)


def admit(kv, request):
    hit = kv.get_computed_blocks(request)
    compute(kv, request, computed=hit)
    return hit


@pytest.fixture
def kv():
    return KVCacheManager(num_blocks=64, block_size=BS)


def test_prompt_gets_one_block_per_block_size_positions(kv):
    request = make_request("a")  # 34 + 30 + 2 = 66 positions
    assert kv.allocate_slots(request, request.num_tokens) is not None
    assert len(kv.block_table("a/cond")) == 5


def test_same_voice_exaggeration_variant_hits_the_conditioning_blocks(kv):
    prefill_and_free(kv, make_request("a"))
    hit = kv.get_computed_blocks(make_request("b", text=range(100, 120)))
    assert hit.num_tokens == 32  # both pure-conditioning blocks; block 2 mixes in other text


@pytest.mark.parametrize("change", [dict(exaggeration=0.7), dict(voice="voice-b"), dict(variant="multilingual")])
def test_other_conditioning_misses(kv, change):
    prefill_and_free(kv, make_request("a"))
    assert kv.get_computed_blocks(make_request("b", **change)).num_tokens == 0


def test_identical_prompt_hit_is_capped_below_the_last_position(kv):
    text = tuple(range(10, 38))  # 34 + 28 + 2 = 64 positions: exactly 4 full blocks
    prefill_and_free(kv, make_request("a", text=text))
    hit = kv.get_computed_blocks(make_request("b", text=text))
    assert hit.num_tokens == 48


def test_cfg_rows_share_conditioning_blocks_but_not_text_blocks(kv):
    prefill_and_free(kv, make_request("a"))  # caches the conditional row's blocks only
    pair = make_request("b", cfg=True)
    hit = admit(kv, pair)
    assert hit.num_blocks == 2  # the unconditional row's text blocks differ from the conditional's
    cond, uncond = kv.block_table("b/cond"), kv.block_table("b/uncond")
    assert cond[:2] == uncond[:2] and not set(cond[2:]) & set(uncond[2:])
    assert [kv.pool.blocks[i].ref_count for i in cond[:2]] == [2, 2]


def test_unconditional_text_blocks_hash_apart_from_conditional_ones(kv):
    pair = make_request("a", cfg=True)
    compute(kv, pair)
    cond, uncond = pair.sequences
    assert cond.block_hashes[:2] == uncond.block_hashes[:2]
    assert not set(cond.block_hashes[2:]) & set(uncond.block_hashes[2:])


def test_second_cfg_pair_hits_both_rows_text(kv):
    prefill_and_free(kv, make_request("a", cfg=True))
    hit = admit(kv, make_request("b", cfg=True))
    assert hit.num_blocks == 4  # (66 - 1) // 16


def test_pair_allocation_never_hands_one_rows_hit_blocks_to_the_other_row():
    kv = KVCacheManager(num_blocks=10, block_size=BS)
    text = tuple(range(10, 40))
    prefill_and_free(kv, make_request("a", text=text, cfg=True))  # LRU head: the uncond row's tail
    pair = make_request("b", text=text + tuple(range(50, 66)), cfg=True)  # 2 new blocks per row
    hit = admit(kv, pair)
    cond, uncond = kv.block_table("b/cond"), kv.block_table("b/uncond")
    assert uncond[:4] == [b.block_id for b in hit.blocks[1]]
    assert not set(cond[2:]) & set(uncond[2:])
    assert all(kv.pool.blocks[i].block_hash is not None for i in uncond[:4])


def test_allocate_returns_none_and_changes_nothing_when_short():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    request = make_request("a")  # needs 5 blocks
    assert kv.allocate_slots(request, request.num_tokens) is None
    assert kv.num_free_blocks == 4 and kv.block_table("a/cond") == []


def test_cfg_pair_allocation_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=7, block_size=BS)
    pair = make_request("a", cfg=True)  # 2 x 5 blocks
    assert kv.allocate_slots(pair, pair.num_tokens) is None
    assert kv.num_free_blocks == 7 and kv.block_table("a/cond") == [] == kv.block_table("a/uncond")


def test_reviving_cached_free_blocks_counts_against_free_blocks():
    kv = KVCacheManager(num_blocks=5, block_size=BS)
    prefill_and_free(kv, make_request("a"))  # 5 blocks, all free again, 4 cached
    other = make_request("b", text=range(100, 120))
    kv.allocate_slots(make_request("filler", cond_len=40, text=range(5)), 40)  # takes 3 LRU-head blocks
    hit = kv.get_computed_blocks(other)
    assert hit.num_blocks == 2  # the conditioning blocks, freed last, survived
    assert kv.allocate_slots(other, other.num_tokens - hit.num_tokens, hit) is None


def test_decode_allocates_a_new_block_only_at_a_block_boundary(kv):
    request = make_request("a", text=tuple(range(10, 38)))  # 64 positions, 4 blocks
    compute(kv, request)
    request.append_output(7)
    assert kv.allocate_slots(request, 1) == [[kv.block_table("a/cond")[-1]]]
    assert len(kv.block_table("a/cond")) == 5
    request.sequences[0].num_computed_tokens += 1
    request.append_output(8)
    assert kv.allocate_slots(request, 1) == [[]]


def test_decode_block_is_cached_once_full(kv):
    request = make_request("a", text=tuple(range(10, 38)))  # 64 positions
    compute(kv, request)
    for token in range(BS):
        request.append_output(token)
        compute(kv, request, 1)
    last = kv.pool.blocks[kv.block_table("a/cond")[4]]
    assert last.block_hash == request.sequences[0].block_hashes[4]


def test_free_puts_tail_blocks_first_so_the_prefix_is_evicted_last(kv):
    request = make_request("a")
    compute(kv, request)
    table = kv.block_table("a/cond")
    kv.free(request)
    assert kv.pool.free_block_ids()[-len(table):] == table[::-1]
    assert request.num_computed_tokens == 0


def test_hit_on_free_blocks_takes_them_back(kv):
    prefill_and_free(kv, make_request("a"))
    request = make_request("b")
    hit = admit(kv, request)
    assert hit.num_blocks == 4 and all(b.ref_count == 1 for b in hit.blocks[0])
    kv.check_invariants()


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    prefill_and_free(kv, make_request("a"))
    assert kv.get_computed_blocks(make_request("b")).num_tokens == 0
    assert kv.metrics().num_cached_free_blocks == 0


def test_admission_records_prefix_hit_rate(kv):
    prefill_and_free(kv, make_request("a"))
    admit(kv, make_request("b", text=range(100, 120)))  # 56 positions, 32 hit
    m = kv.metrics()
    assert (m.prefix_queried_tokens, m.prefix_hit_tokens) == (56, 32)
