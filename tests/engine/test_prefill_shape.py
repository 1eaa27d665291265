"""Scheduler's PrefillShape: a step that decodes takes at most so many prompt rows and positions
(the engine's largest mixed CUDA graph), the rest waits for the next steps."""
from chorus.engine.config import SchedulerConfig
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.request import RequestStatus
from chorus.engine.scheduler import PrefillShape, Scheduler
from tests.engine.test_schedule_ahead import _steady
from tests.engine.test_scheduler import BS, TOKEN, Clock, make_request, step


def _scheduler(shape, *, admit_ahead=False, budget=64):
    config = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=64,
                             admit_ahead=admit_ahead)
    return Scheduler(config, KVCacheManager(128, BS), clock=Clock(), prefill_shape=shape)


def _prompt_part(out):
    """(rows, positions) of the step's rows that compute more than one position."""
    spans = [row.num_tokens for row in out.rows if row.num_tokens > 1]
    return len(spans), sum(spans)


def _decode_rows(out):
    return sum(1 for row in out.rows if row.num_tokens == 1)


def test_beside_decode_rows_a_burst_is_admitted_a_shape_at_a_time():
    s = _scheduler(PrefillShape(rows=2, tokens=64))
    decoding = make_request("d", max_tokens=40)
    _steady(s, decoding)  # leaves the step in flight uncommitted
    s.update_from_output(s._in_flight[0], {"d": TOKEN})
    burst = [make_request(f"w{i}", text_len=3, max_tokens=3) for i in range(5)]
    for r in burst:
        s.add_request(r)
    admitted_per_step, seen = [], set()
    while any(r.status is RequestStatus.WAITING for r in burst):
        out, _ = step(s)
        assert _decode_rows(out) >= 1 and _prompt_part(out)[0] <= 2
        new = set(out.requests) - seen - {"d"}
        admitted_per_step.append(len(new))
        seen |= new
    assert admitted_per_step == [2, 2, 1]


def test_beside_decode_rows_prompt_positions_stay_within_the_shape():
    s = _scheduler(PrefillShape(rows=8, tokens=10))
    _steady(s, make_request("d", max_tokens=40))
    s.update_from_output(s._in_flight[0], {"d": TOKEN})
    burst = [make_request(f"w{i}", text_len=5, max_tokens=2) for i in range(4)]  # 8 positions each
    for r in burst:
        s.add_request(r)
    while any(not r.output_tokens for r in burst):
        out, _ = step(s)
        assert _prompt_part(out)[1] <= 10
    s.check_invariants()


def test_a_cfg_pair_counts_two_prompt_rows():
    s = _scheduler(PrefillShape(rows=2, tokens=64))
    _steady(s, make_request("d", max_tokens=40))
    s.update_from_output(s._in_flight[0], {"d": TOKEN})
    pairs = [make_request(f"c{i}", cfg=True, text_len=3) for i in range(2)]
    for r in pairs:
        s.add_request(r)
    out, _ = step(s)
    assert [rid for rid in out.requests if rid != "d"] == ["c0"] and _prompt_part(out) == (2, 12)


def test_without_decode_rows_the_shape_does_not_bound_admission():
    s = _scheduler(PrefillShape(rows=1, tokens=4))
    burst = [make_request(f"w{i}", text_len=3) for i in range(3)]
    for r in burst:
        s.add_request(r)
    out, _ = step(s)
    assert list(out.requests) == ["w0", "w1", "w2"] and _prompt_part(out) == (3, 18)


def test_a_step_admitted_ahead_keeps_to_the_shape_too():
    s = _scheduler(PrefillShape(rows=2, tokens=64), admit_ahead=True)
    prev = _steady(s, make_request("d", max_tokens=40))
    for i in range(3):
        s.add_request(make_request(f"w{i}", text_len=3))
    ahead = s.schedule_ahead()
    assert list(ahead.requests) == ["d", "w0", "w1"] and _prompt_part(ahead) == (2, 12)
    s.update_from_output(prev, {"d": TOKEN})
    s.update_from_output(ahead, {"d": TOKEN, "w0": TOKEN, "w1": TOKEN})
    s.check_invariants()


def test_every_request_of_a_burst_beside_decode_rows_runs_to_its_end():
    s = _scheduler(PrefillShape(rows=2, tokens=8))
    requests = [make_request("d", max_tokens=30)] + [make_request(f"w{i}", text_len=4, max_tokens=5) for i in range(6)]
    s.add_request(requests[0])
    step(s)
    for r in requests[1:]:
        s.add_request(r)
    while s.has_unfinished_requests():
        out, _ = step(s)
        if _decode_rows(out):
            rows, positions = _prompt_part(out)
            assert rows <= 2 and positions <= 8
    assert all(r.status is RequestStatus.FINISHED and len(r.output_tokens) == 5 for r in requests[1:])
