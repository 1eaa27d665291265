"""Scheduler.schedule_ahead: the next steady decode step, scheduled while one is in flight."""
from chorus.engine.request import Priority, RequestStatus
from tests.engine.test_scheduler import BS, EOS, TOKEN, Clock, make_request, make_scheduler, spans, step


def _steady(s, *requests):
    """Admit ``requests`` and step until every one decodes (one step in flight afterwards)."""
    for r in requests:
        s.add_request(r)
    while any(r.num_computed_tokens < r.num_tokens - 1 or not r.output_tokens for r in requests):
        step(s)
    return s.schedule()


def test_the_step_ahead_is_every_request_one_position_further():
    s = make_scheduler()
    a, b = make_request("a", cfg=True), make_request("b")
    prev = _steady(s, a, b)
    ahead = s.schedule_ahead()
    assert ahead is not None
    assert [(sid, start - 1, n, logits) for sid, start, n, logits in spans(ahead)] == spans(prev)
    s.check_invariants()  # tables cover the positions of both steps in flight


def test_commits_go_oldest_first_and_the_step_ahead_stays_in_flight():
    s = make_scheduler()
    a = make_request("a", max_tokens=20)
    prev = _steady(s, a)
    ahead = s.schedule_ahead()
    s.update_from_output(prev, {"a": TOKEN})
    s.check_invariants()
    assert s.schedule_ahead() is not None  # the step ahead is now the one in flight
    s.update_from_output(ahead, {"a": TOKEN})


def test_a_request_that_the_step_in_flight_ends_by_length_is_left_out():
    s = make_scheduler()
    a, b = make_request("a", max_tokens=3), make_request("b", max_tokens=20)
    prev = _steady(s, a, b)
    while len(a.output_tokens) + 1 < a.max_tokens:
        s.update_from_output(prev, {"a": TOKEN, "b": TOKEN})
        prev = s.schedule()
    ahead = s.schedule_ahead()
    assert list(ahead.requests) == ["b"]


def test_a_request_ending_on_eos_in_flight_keeps_a_wasted_row_that_the_commit_ignores():
    s = make_scheduler()
    a, b = make_request("a", max_tokens=20), make_request("b", max_tokens=20)
    prev = _steady(s, a, b)
    ahead = s.schedule_ahead()
    assert list(ahead.requests) == ["a", "b"]
    s.update_from_output(prev, {"a": EOS, "b": TOKEN})
    assert a.status is RequestStatus.FINISHED
    s.check_invariants()  # a's blocks, the one for the step ahead included, are free
    results = s.update_from_output(ahead, {"a": TOKEN, "b": TOKEN})
    assert [r.request_id for r in results] == ["b"] and len(b.output_tokens) == len(a.output_tokens) + 2


def test_a_block_boundary_ahead_gets_its_block():
    s = make_scheduler()
    a = make_request("a", max_tokens=20)
    prev = _steady(s, a)
    while (a.num_computed_tokens + 1) % BS:
        s.update_from_output(prev, {"a": TOKEN})
        prev = s.schedule()
    blocks = s.kv.num_free_blocks
    ahead = s.schedule_ahead()
    assert ahead.row_starts[0] % BS == 0 and s.kv.num_free_blocks == blocks - 1


def test_nothing_is_scheduled_ahead_when_the_regular_schedule_could_decide_otherwise():
    # a waiting request that could be admitted
    s = make_scheduler()
    _steady(s, make_request("a"))
    s.add_request(make_request("w"))
    assert s.schedule_ahead() is None
    # a request still prefilling (chunked)
    s = make_scheduler(budget=4, max_num_seqs=2)
    s.add_request(make_request("a", max_tokens=20))
    step(s)
    s.add_request(make_request("p", text_len=20))
    s.schedule()
    assert s.schedule_ahead() is None
    # a passed deadline
    clock = Clock()
    s = make_scheduler(clock=clock)
    _steady(s, make_request("a", deadline=5.0))
    clock.now = 6.0
    assert s.schedule_ahead() is None
    # a pool too short for the next blocks (the regular schedule preempts)
    s = make_scheduler(num_blocks=3)
    a, b = make_request("a", max_tokens=5, cond_len=1), make_request("b", max_tokens=5, cond_len=1, voice="w")
    prev = _steady(s, a, b)
    while prev.row_starts[0] != BS - 1:  # the step ahead starts a second block in both rows
        s.update_from_output(prev, {"a": TOKEN, "b": TOKEN})
        prev = s.schedule()
    assert s.kv.num_free_blocks == 1 and s.schedule_ahead() is None


def test_a_full_batch_with_waiting_requests_is_still_scheduled_ahead():
    s = make_scheduler(max_num_seqs=1)
    _steady(s, make_request("a", max_tokens=20))
    s.add_request(make_request("w", priority=Priority.HIGH))  # no row for it: admission waits anyway
    assert s.schedule_ahead() is not None


# -- admit_ahead --------------------------------------------------------------------------------

def test_with_admit_ahead_an_arrival_joins_the_step_ahead_with_its_prompt():
    s = make_scheduler(admit_ahead=True)
    a = make_request("a", max_tokens=20)
    prev = _steady(s, a)
    w = make_request("w", text_len=3)
    s.add_request(w)
    ahead = s.schedule_ahead()
    assert list(ahead.requests) == ["a", "w"] and w.status is RequestStatus.RUNNING
    # a decodes one position past the step in flight; w computes its whole prompt and samples
    assert spans(ahead) == [(spans(prev)[0][0], spans(prev)[0][1] + 1, 1, True),
                            (w.sequences[0].seq_id, 0, w.num_tokens, True)]
    s.check_invariants()
    s.update_from_output(prev, {"a": TOKEN})
    s.update_from_output(ahead, {"a": TOKEN, "w": TOKEN})
    s.check_invariants()
    assert len(w.output_tokens) == 1 and s.num_prefilling == 0


def _low_preempted_for_high(s):
    """A low-priority request decoding; a high-priority arrival that needs every block of the
    pool. Returns the first and the regular step that preempted it for the second (in flight)."""
    low = make_request("low", max_tokens=8, cond_len=1, priority=Priority.LOW)
    prev = _steady(s, low)
    high = make_request("high", max_tokens=3, cond_len=27, voice="w", priority=Priority.HIGH)
    s.add_request(high)
    ahead = s.schedule_ahead()
    assert list(ahead.requests) == ["low"] and high.status is RequestStatus.WAITING
    s.update_from_output(prev, {"low": TOKEN})
    assert s.schedule_ahead() is None  # the pool is short: the regular schedule's turn
    s.update_from_output(ahead, {"low": TOKEN})
    return low, s.schedule()


def test_with_admit_ahead_a_pool_short_for_an_arrival_leaves_the_preemption_to_the_regular_schedule():
    s = make_scheduler(num_blocks=8, admit_ahead=True)
    low, out = _low_preempted_for_high(s)
    assert list(out.requests) == ["high"] and low.status is RequestStatus.PREEMPTED
    s.check_invariants()


def test_with_admit_ahead_a_recompute_at_the_queues_head_leaves_the_step_to_the_regular_schedule():
    s = make_scheduler(num_blocks=8, admit_ahead=True)
    low, _ = _low_preempted_for_high(s)
    assert low.output_tokens and s.waiting.peek() is low
    assert s.schedule_ahead() is None  # its generated tokens come from the host
