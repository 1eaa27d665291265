"""Scheduler: budget, chunked prefill, priorities, CFG pairs, admission, preemption, stops
(which requests can never run: test_admission.py)."""
import random

import pytest

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.request import FinishReason, Priority, Request, RequestStatus, T3Prompt, conditioning_key
from chorus.engine.scheduler import Scheduler

BS = 4
BOS, EOS = 6561, 6562
TOKEN = 5


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_request(rid, *, text_len=1, cond_len=2, cfg=False, priority=Priority.NORMAL, max_tokens=8,
                 voice="v", exaggeration=0.5, text_base=100, **kw):
    prompt = T3Prompt(cond_key=conditioning_key("original", voice, exaggeration), cond_len=cond_len,
                      text_ids=tuple(range(text_base, text_base + text_len)), bos_token=BOS,
                      eos_token=EOS, bos_copies=1, cfg=cfg)
    return Request(rid, prompt, priority=priority, max_tokens=max_tokens, **kw)


def make_scheduler(num_blocks=64, *, max_num_seqs=8, budget=64, max_model_len=64, chunked=True,
                   clock=None, admit_ahead=False):
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                             max_model_len=max_model_len, enable_chunked_prefill=chunked, admit_ahead=admit_ahead)
    return Scheduler(config, KVCacheManager(num_blocks, BS), clock=clock or Clock())


def step(s, token=TOKEN):
    out = s.schedule()
    sampled = {s_.request_id: token for s_ in out.rows if s_.needs_logits}
    results = s.update_from_output(out, sampled)
    s.check_invariants()
    return out, results


def spans(out):
    return [(r.seq_id, r.start, r.num_tokens, r.needs_logits) for r in out.rows]


@pytest.mark.parametrize("kw, message", [
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_seqs=64, max_num_batched_tokens=32), "must be >= max_num_seqs"),
    (dict(enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=1024), "chunked"),
    (dict(async_scheduling=False, admit_ahead=True), "admit_ahead needs async_scheduling"),
])
def test_scheduler_config_rejects_bad_values_with_the_rule(kw, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kw)


def test_cache_config_wants_a_power_of_two_block_size():
    with pytest.raises(ValueError, match="power of two"):
        CacheConfig(block_size=24)


def test_engine_config_routes_flat_options_and_rejects_unknown_ones():
    config = EngineConfig.from_flat(variant="en", block_size=32, max_num_seqs=8)
    assert (config.variant, config.cache.block_size, config.scheduler.max_num_seqs) == ("original", 32, 8)
    with pytest.raises(ValueError, match="unknown engine option 'blocksize'"):
        EngineConfig.from_flat(blocksize=32)


def test_token_budget_is_respected_every_step():
    s = make_scheduler(budget=16)
    for i in range(5):
        s.add_request(make_request(f"r{i}", text_len=7, max_tokens=4, cfg=i % 2 == 1))
    while s.has_unfinished_requests():
        out, _ = step(s)
        assert 0 < out.total_num_tokens <= 16


def test_long_prompt_is_prefilled_in_chunks_with_logits_only_at_the_end():
    s = make_scheduler(budget=16)
    s.add_request(make_request("a", text_len=37))  # 2 + 37 + 1 = 40 positions
    seen = [spans(step(s)[0]) for _ in range(4)]
    assert seen == [[("a/cond", 0, 16, False)], [("a/cond", 16, 16, False)],
                    [("a/cond", 32, 8, True)], [("a/cond", 40, 1, True)]]


def test_num_prefilling_counts_requests_with_prompt_positions_left():
    s = make_scheduler(budget=16)
    s.add_request(make_request("a", text_len=37))  # 40 positions: three prefill steps
    assert s.num_prefilling == 0  # waiting, not running
    counts = [s.num_prefilling for _ in range(3) if step(s)]
    assert counts == [1, 1, 0]


def test_decode_rows_come_before_prefill_chunks():
    s = make_scheduler()
    s.add_request(make_request("a"))
    step(s)
    s.add_request(make_request("b", text_len=9))
    out, _ = step(s)
    assert [r.seq_id for r in out.rows] == ["a/cond", "b/cond"] and out.rows[0].num_tokens == 1


def test_higher_priority_is_admitted_first():
    s = make_scheduler(max_num_seqs=1)
    for rid, p in (("low", Priority.LOW), ("normal", Priority.NORMAL), ("high", Priority.HIGH)):
        s.add_request(make_request(rid, priority=p))
    assert list(step(s)[0].requests) == ["high"]


def test_same_priority_is_admitted_in_arrival_order():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("first"))
    s.add_request(make_request("second"))
    assert list(step(s)[0].requests) == ["first"]


def test_cfg_pair_counts_as_two_rows_against_max_num_seqs():
    s = make_scheduler(max_num_seqs=3)
    s.add_request(make_request("a", cfg=True))
    s.add_request(make_request("b", cfg=True))
    out, _ = step(s)
    assert list(out.requests) == ["a"] and s.stats().num_running_rows == 2


def test_cfg_pair_rows_are_adjacent_with_the_same_span():
    s = make_scheduler()
    s.add_request(make_request("x"))
    s.add_request(make_request("y", cfg=True))
    out, _ = step(s)
    assert [r.seq_id for r in out.rows] == ["x/cond", "y/cond", "y/uncond"]
    assert out.cfg_pairs() == [(1, 2)]
    assert (out.rows[1].start, out.rows[1].num_tokens) == (out.rows[2].start, out.rows[2].num_tokens)


def test_prefix_hit_skips_cached_positions():
    s = make_scheduler()
    s.add_request(make_request("a", text_len=9, max_tokens=1))  # 12 positions
    step(s)
    s.add_request(make_request("b", text_len=9, max_tokens=1))
    assert spans(step(s)[0]) == [("b/cond", 8, 4, True)]  # 2 blocks hit, capped below the last


def test_preemption_takes_lowest_priority_newest_first():
    s = make_scheduler(num_blocks=5)
    for rid, p in (("A", Priority.HIGH), ("B", Priority.LOW), ("C", Priority.LOW), ("D", Priority.NORMAL)):
        s.add_request(make_request(rid, priority=p))  # 4 positions: one block each
    step(s)
    out, _ = step(s)  # every row needs a new block; one is free
    assert out.preempted == ["C", "B"] and list(out.requests) == ["A", "D"]
    assert [r.request_id for r in s.waiting] == ["B", "C"]


def test_cfg_pair_is_preempted_as_one_unit():
    s = make_scheduler(num_blocks=5)
    s.add_request(make_request("A", priority=Priority.HIGH))
    s.add_request(make_request("P", priority=Priority.LOW, cfg=True, max_tokens=4))
    step(s)
    out, _ = step(s)  # A takes one of two free blocks; P's rows need two
    pair = s.get_request("P")
    assert out.preempted == ["P"] and pair.status is RequestStatus.PREEMPTED
    assert all(s.kv.block_table(seq.seq_id) == [] and seq.num_computed_tokens == 0 for seq in pair.sequences)
    assert s.kv.num_free_blocks == 3


def test_waiting_high_priority_preempts_lower_priority_running():
    s = make_scheduler(num_blocks=4)
    s.add_request(make_request("low", priority=Priority.LOW, text_len=5))  # 8 positions, 2 blocks
    step(s)
    s.add_request(make_request("high", priority=Priority.HIGH, text_len=9, max_tokens=4))  # 3 blocks
    out, _ = step(s)
    assert out.preempted == ["low"] and list(out.requests) == ["high"]


def test_waiting_request_does_not_preempt_equal_priority():
    s = make_scheduler(num_blocks=4)
    s.add_request(make_request("first", text_len=5))
    step(s)
    s.add_request(make_request("second", text_len=9, max_tokens=4))
    out, _ = step(s)
    assert out.preempted == [] and list(out.requests) == ["first"]


def test_recompute_after_preemption_restores_the_same_token_count():
    s = make_scheduler(num_blocks=4)
    low = make_request("low", priority=Priority.LOW, max_tokens=8)
    s.add_request(low)
    for _ in range(4):
        step(s)
    tokens, computed, outputs = low.num_tokens, low.num_computed_tokens, list(low.output_tokens)
    s.add_request(make_request("high", priority=Priority.HIGH, text_len=9, max_tokens=4))
    assert step(s)[0].preempted == ["low"]
    assert low.output_tokens == outputs and low.num_tokens == tokens  # generated tokens kept
    while low.status is not RequestStatus.RUNNING:
        out, _ = step(s)
    (row,) = [r for r in out.rows if r.request_id == "low"]
    assert (row.end, row.needs_logits) == (tokens, True)  # prompt + generated, all recomputed
    assert low.num_computed_tokens == computed + 1 and low.num_tokens == tokens + 1
    while s.has_unfinished_requests():
        step(s)
    assert low.finish_reason is FinishReason.LENGTH and len(low.output_tokens) == 8


def test_abort_of_a_running_request_frees_every_block():
    s = make_scheduler()
    s.add_request(make_request("a", cfg=True, text_len=9))
    step(s)
    result = s.abort("a")
    assert result.finish_reason is FinishReason.ABORTED
    assert s.kv.num_free_blocks == 64 and not s.has_unfinished_requests()


def test_abort_of_a_waiting_request_dequeues_it():
    s = make_scheduler()
    s.add_request(make_request("a"))
    s.abort("a")
    assert len(s.waiting) == 0 and step(s)[0].is_empty


def test_abort_of_an_unknown_request_is_none():
    assert make_scheduler().abort("nope") is None


def test_abort_while_the_step_runs_skips_the_request_in_update():
    s = make_scheduler()
    s.add_request(make_request("a"))
    out = s.schedule()
    s.abort("a")
    assert s.update_from_output(out, {"a": TOKEN}) == []
    assert s.kv.num_free_blocks == 64


def test_deadline_expiry_finishes_waiting_and_running_requests():
    clock = Clock()
    s = make_scheduler(max_num_seqs=1, clock=clock)
    s.add_request(make_request("running", deadline=5.0))
    s.add_request(make_request("waiting", deadline=5.0))
    step(s)
    clock.now = 5.0
    out, _ = step(s)
    assert {(f.request_id, f.finish_reason) for f in out.finished} == {
        ("running", FinishReason.DEADLINE), ("waiting", FinishReason.DEADLINE)}
    assert s.kv.num_free_blocks == 64


def test_a_finished_request_does_not_expire_later():
    clock = Clock()
    s = make_scheduler(clock=clock)
    s.add_request(make_request("a", max_tokens=1, deadline=5.0))
    step(s)
    clock.now = 6.0
    out, _ = step(s)
    assert out.finished == [] and out.is_empty


def test_decode_rows_get_a_block_only_at_a_block_boundary_in_scheduling_order():
    s = make_scheduler()
    s.add_request(make_request("a", max_tokens=8))  # 4 positions: one full block
    s.add_request(make_request("b", max_tokens=8, text_len=2, priority=Priority.HIGH))  # 5 positions
    first, _ = step(s)  # b admitted first (priority): b takes blocks 0-1, a takes block 2
    assert spans(first) == [("b/cond", 0, 5, True), ("a/cond", 0, 4, True)]
    out, _ = step(s)  # a's next position (4) starts a block, b's (5) does not
    assert spans(out) == [("b/cond", 5, 1, True), ("a/cond", 4, 1, True)]
    assert s.kv.block_table("b/cond") == [0, 1] and s.kv.block_table("a/cond") == [2, 3]
    for _ in range(3):
        step(s)  # b reaches position 8, a block boundary
    assert s.kv.block_table("b/cond") == [0, 1, 4]
    assert [r.block_table for r in out.rows] == [(0, 1), (2, 3)]  # the tables as scheduled


def test_eos_finishes_without_appending_the_eos_token():
    s = make_scheduler()
    s.add_request(request := make_request("a"))
    _, (result,) = step(s, token=EOS)
    assert result.finish_reason is FinishReason.EOS and result.new_token is None
    assert request.output_tokens == []


def test_eos_before_min_tokens_is_kept_as_a_token():
    s = make_scheduler()
    s.add_request(request := make_request("a", min_tokens=2))
    _, (result,) = step(s, token=EOS)
    assert result.finish_reason is None and request.output_tokens == [EOS]


def test_ignore_eos_runs_to_max_tokens():
    s = make_scheduler()
    s.add_request(request := make_request("a", ignore_eos=True, max_tokens=3))
    while s.has_unfinished_requests():
        step(s, token=EOS)
    assert request.finish_reason is FinishReason.LENGTH and request.output_tokens == [EOS] * 3


def test_max_tokens_finishes_with_length_and_frees_blocks():
    s = make_scheduler()
    s.add_request(request := make_request("a", max_tokens=2))
    results = [step(s)[1] for _ in range(2)]
    assert results[-1][0].finish_reason is FinishReason.LENGTH and request.output_tokens == [TOKEN] * 2
    assert s.kv.num_free_blocks == 64


def _prefix_ids(seq):
    ids, prev = [], seq.cond_key
    for key in seq.keys:
        prev = hash((prev, key))
        ids.append(prev)
    return ids


def _fake_forward(kv, out, store):
    """Write each computed position's prefix identity into its slot, then check every row
    reads back its whole prefix: proves hits, sharing and block reuse never mix contents."""
    expected = {}
    for row in out.rows:
        seq = next(q for q in out.requests[row.request_id].sequences if q.seq_id == row.seq_id)
        expected[row.seq_id] = ids = _prefix_ids(seq)
        assert len(row.block_table) * BS >= row.end
        for p in range(row.start, row.end):
            block = kv.pool.blocks[row.block_table[p // BS]]
            assert block.ref_count == 1 and block.block_hash is None  # never write a shared block
            store[(block.block_id, p % BS)] = ids[p]
    for row in out.rows:
        ids = expected[row.seq_id]
        assert all(store[(row.block_table[p // BS], p % BS)] == ids[p] for p in range(row.end))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_mix_of_finish_abort_preemption_leaks_no_block(seed):
    rng = random.Random(seed)
    clock = Clock()
    s = make_scheduler(num_blocks=24, max_num_seqs=6, budget=24, max_model_len=48, clock=clock)
    store, n = {}, 0
    for t in range(400):
        clock.now = float(t)
        if t < 300 and rng.random() < 0.35:
            n += 1
            s.add_request(make_request(
                f"r{n}", cfg=rng.random() < 0.4, priority=rng.choice(list(Priority)),
                text_len=rng.randint(1, 14), max_tokens=rng.randint(1, 28), voice=rng.choice("ab"),
                text_base=rng.choice([100, 200]), min_tokens=rng.choice([0, 1]),
                ignore_eos=rng.random() < 0.1, deadline=t + rng.randint(5, 60) if rng.random() < 0.2 else None,
            ))
        if rng.random() < 0.05 and s.has_unfinished_requests():
            s.abort(rng.choice(sorted(s._requests)))
        out = s.schedule()
        assert out.total_num_tokens <= 24 and len(out.rows) <= 6
        _fake_forward(s.kv, out, store)
        if rng.random() < 0.03 and out.requests:
            s.abort(rng.choice(list(out.requests)))  # abort while the step is in flight
        sampled = {r.request_id: rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, EOS]) for r in out.rows if r.needs_logits}
        s.update_from_output(out, sampled)
        s.check_invariants()
        if t >= 300 and not s.has_unfinished_requests():
            break
    assert not s.has_unfinished_requests()
    assert s.num_preemptions > 0  # the mix did exercise preemption
    assert s.kv.num_free_blocks == 24 and all(b.ref_count == 0 for b in s.kv.pool.blocks)
    s.kv.check_invariants()
