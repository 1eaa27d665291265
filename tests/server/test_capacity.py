"""The admission policy's arithmetic (chorus/server/capacity.py, admission.py) on known numbers;
tests/server/test_overload.py checks it on a live server."""
from __future__ import annotations

import gc
import random

import pytest

from chorus.engine.request import Priority
from chorus.server.admission import Admission
from chorus.server.capacity import MIN_UTILIZATION, RATE_WINDOW_S, CapacityModel, InFlight, Work, stage_load_s
from chorus.server.errors import APIError


def _model(rate: float | None = 100.0, solo: float | None = 0.5) -> CapacityModel:
    model = CapacityModel(prior_tokens_per_char=2.0, prior_rate=rate, first_window_tokens=20)
    if solo is not None:
        model.observe_solo_start(solo)
    return model


def test_a_requests_tokens_come_from_its_characters_capped_by_its_budget():
    model = _model()
    assert model.predict_tokens(50, chunks=1, max_new_tokens=None) == 100
    assert model.predict_tokens(50, chunks=2, max_new_tokens=30) == 60


def test_the_predicted_start_is_the_solo_latency_plus_a_first_window_of_each_request_in_flight():
    model = _model(rate=100.0, solo=0.5)
    in_flight = [Work(tokens=500), Work(tokens=10), Work(tokens=500, delivered=495)]
    estimate = model.estimate(100, in_flight)
    assert estimate.start_s == pytest.approx(0.5 + (20 + 10 + 5) / 100)
    assert estimate.drain_s == pytest.approx((500 + 10 + 5 + 100) / 100)


def test_the_rate_is_learned_from_busy_time_only():
    model = _model(rate=None)
    model.observe_delivery(10.0, 0.0, busy=False)  # idle: says nothing
    assert model.rate is None
    model.observe_delivery(RATE_WINDOW_S, 300.0 * RATE_WINDOW_S, busy=True)
    assert model.rate == pytest.approx(300.0)


def test_the_rate_is_what_the_busiest_stage_would_deliver_busy_all_the_time():
    model = _model(rate=None)
    model.observe_delivery(RATE_WINDOW_S, 100.0 * RATE_WINDOW_S, busy=True, stage_busy_s=0.25 * RATE_WINDOW_S)
    assert model.rate == pytest.approx(400.0)  # a stage busy a quarter of the time: four times as much


def test_a_saturated_stage_makes_the_rate_what_was_delivered():
    model = _model(rate=None)
    model.observe_delivery(RATE_WINDOW_S, 100.0 * RATE_WINDOW_S, busy=True, stage_busy_s=2 * RATE_WINDOW_S)
    assert model.rate == pytest.approx(100.0)  # busy time beyond the wall time (two threads) counts as 1


def test_an_almost_idle_stage_extrapolates_at_most_by_the_utilization_floor():
    model = _model(rate=None)
    model.observe_delivery(RATE_WINDOW_S, 10.0 * RATE_WINDOW_S, busy=True, stage_busy_s=0.0)
    assert model.rate == pytest.approx(10.0 / MIN_UTILIZATION)


def test_a_request_cut_by_its_token_cap_never_lowers_tokens_per_char():
    model = _model()
    model.observe_cost(100, 50, capped=True)
    assert model.tokens_per_char == 2.0
    model.observe_cost(100, 50, capped=False)
    assert model.tokens_per_char < 2.0


def _admission(model: CapacityModel) -> Admission:
    return Admission(100, 0.98, 1, capacity=model, max_retry_after_s=30)


def _admit(admission: Admission, priority=Priority.NORMAL, tokens=500.0):
    return admission.admit(priority, tokens=tokens, chars=100, start_deadline_s=1.0, queue_limit=100,
                           kv_usage=0.0, waiting=0)


def test_a_request_predicted_to_miss_its_start_deadline_is_refused_with_a_retry_after():
    admission = _admission(_model(rate=100.0, solo=0.5))
    tickets = [_admit(admission) for _ in range(3)]  # the third: 0.5 + 2 * 20 / 100 = 0.9 s <= 0.9 x 1 s
    with pytest.raises(APIError) as info:
        _admit(admission)  # 0.5 + 3 * 20 / 100 = 1.1 s
    assert info.value.status == 429 and info.value.code == "overloaded"
    # 0.2 s over 0.9 s; 500 tokens left per request, 20 per first window: 5 s
    assert info.value.headers["Retry-After"] == "5"
    admission.release(tickets[0])
    _admit(admission)


def test_high_priority_may_use_the_whole_start_deadline_and_low_only_part_of_it():
    admission = _admission(_model(rate=100.0, solo=0.5))
    _admit(admission)  # 0.7 s predicted for the next one
    with pytest.raises(APIError):
        _admit(admission, Priority.LOW)  # beyond 0.6 x 1 s
    _admit(admission, Priority.HIGH)


def test_a_request_that_finds_nothing_in_flight_is_always_admitted():
    admission = _admission(_model(rate=100.0, solo=5.0))  # alone it is predicted to miss the deadline
    assert _admit(admission).alone


def test_the_queue_policy_ignores_predictions():
    model = _model(rate=1.0, solo=5.0)
    admission = Admission(100, 0.98, 1, capacity=model, policy="queue")
    for _ in range(5):
        _admit(admission)
    assert admission.in_flight == 5


def test_predictions_are_calibrated_by_their_own_errors():
    model = _model(rate=100.0, solo=0.5)
    in_flight = [Work(tokens=500)]
    estimate = model.estimate(100, in_flight)
    raw = estimate.start_s  # 0.7 s
    model.observe_start(estimate, 2 * raw)  # the first audio came twice as late as predicted
    assert model.bias == pytest.approx(1.3)  # EWMA 0.3
    assert model.estimate(100, in_flight).start_s == pytest.approx(1.3 * raw)
    for _ in range(50):
        model.observe_start(model.estimate(100, in_flight), 100 * raw)
    assert model.bias == 4.0  # bounded


def test_a_request_waiting_past_its_prediction_raises_the_calibration_at_once():
    model = _model(rate=100.0, solo=0.5)
    estimate = model.estimate(100, [Work(tokens=500)])  # 0.7 s
    model.observe_waiting(estimate, 0.5)  # not late yet: says nothing
    assert model.bias == 1.0
    model.observe_waiting(estimate, 2.1)  # still waiting at three times the prediction
    assert model.bias == pytest.approx(3.0)
    model.observe_waiting(estimate, 1.4)  # a smaller lower bound never lowers it
    assert model.bias == pytest.approx(3.0)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_request_late_for_its_first_audio_tightens_admission_before_it_starts():
    clock = _Clock()
    late = Admission(100, 0.98, 1, capacity=_model(rate=100.0, solo=0.5), clock=clock)
    _admit(late)  # predicted 0.5 s
    clock.now = 1.5  # still no audio at three times that: the next one is predicted 3 x 0.7 s
    with pytest.raises(APIError) as info:
        _admit(late)
    assert info.value.code == "overloaded" and late.capacity.bias == pytest.approx(3.0)
    on_time = Admission(100, 0.98, 1, capacity=_model(rate=100.0, solo=0.5), clock=_Clock())
    _admit(on_time)
    _admit(on_time)  # 0.7 s <= 0.9 x 1 s


def test_a_request_counts_as_late_only_until_its_first_audio_or_its_end():
    clock = _Clock()
    admission = Admission(100, 0.98, 1, capacity=_model(rate=100.0, solo=0.5), clock=clock)
    started, released = _admit(admission), _admit(admission)
    admission.started(started, 0.5)  # on time: the bias stays 1
    admission.release(released)
    clock.now = 10.0
    _admit(admission)
    assert admission.capacity.bias == pytest.approx(1.0)


def test_a_continuations_first_audio_teaches_nothing():
    # the vocoder holds a continuation back while its listener has audio ahead
    clock = _Clock()
    admission = Admission(100, 0.98, 1, capacity=_model(rate=100.0, solo=0.5), clock=clock)
    head = _admit(admission)
    admission.started(head, head.estimate.start_s)
    piece = admission.admit(Priority.NORMAL, tokens=500.0, chars=100, start_deadline_s=1.0, queue_limit=100,
                            kv_usage=0.0, waiting=0, continues=head)
    clock.now = 30.0
    _admit(admission)  # the piece waiting long is not late
    admission.started(piece, 30.0)
    assert admission.capacity.bias == pytest.approx(1.0)


def test_a_full_t3_batch_adds_the_wait_for_rows():
    model = _model(rate=100.0, solo=0.5)
    model.max_rows = 2
    in_flight = [Work(tokens=300), Work(tokens=100)]  # both rows taken
    # a row frees when the shorter finishes: 100 tokens of each by then (200), plus a window of each
    assert model.estimate(50, in_flight).start_s == pytest.approx(0.5 + (200 + 40) / 100)
    model.max_rows = 3
    assert model.estimate(50, in_flight).start_s == pytest.approx(0.5 + 40 / 100)


def _realtime_admission(rate: float, headroom: float = 1.25) -> Admission:
    # a generous start deadline: only the real-time bound can refuse here
    return Admission(1000, 0.98, 1, capacity=_model(rate=rate, solo=0.0), max_retry_after_s=30,
                     realtime_headroom=headroom)


def _admit_long(admission: Admission, priority=Priority.HIGH):
    return admission.admit(priority, tokens=250.0, chars=100, start_deadline_s=1000.0, queue_limit=1000,
                           kv_usage=0.0, waiting=0)


def test_the_realtime_bound_admits_streams_while_each_gets_the_headroom_times_real_time():
    # 1000 tokens/s = 40 s of audio per second: 32 streams at 1.25x real time
    admission = _realtime_admission(rate=1000.0)
    tickets = [_admit_long(admission) for _ in range(32)]
    with pytest.raises(APIError) as info:
        _admit_long(admission)  # a 33rd would leave 40 / 33 = 1.21x real time each
    assert info.value.status == 429 and info.value.code == "overloaded"
    assert "real time" in info.value.message
    # the first of 32 streams with 250 tokens left, sharing 1000 tokens/s, is done in 8 s
    assert info.value.headers["Retry-After"] == "8"
    admission.release(tickets[0])
    _admit_long(admission)


def test_the_realtime_bound_keeps_room_for_high_priority():
    admission = _realtime_admission(rate=1000.0)
    for _ in range(28):  # normal may use 90%: 40 / (29 * 1.25 / 0.9) < 1
        _admit_long(admission, Priority.NORMAL)
    with pytest.raises(APIError):
        _admit_long(admission, Priority.NORMAL)
    _admit_long(admission, Priority.HIGH)


def test_the_realtime_bound_is_off_at_zero_headroom():
    admission = _realtime_admission(rate=100.0, headroom=0.0)  # 4 s of audio per second
    for _ in range(10):
        _admit_long(admission)


def test_the_realtime_bound_follows_the_measured_rate():
    model = _model(rate=100.0, solo=0.0)
    admission = Admission(1000, 0.98, 1, capacity=model, realtime_headroom=1.0)
    _admit_long(admission)
    _admit_long(admission)  # 2 streams x 25 = 50 <= 100 tokens/s
    for _ in range(5):  # busy seconds at 500 tokens/s: the EWMA climbs
        model.observe_delivery(RATE_WINDOW_S, 500.0 * RATE_WINDOW_S, busy=True)
    assert model.rate > 400
    for _ in range(12):
        _admit_long(admission)


def test_a_streams_pieces_count_once_in_the_realtime_bound():
    admission = _realtime_admission(rate=1000.0)  # 32 streams at 1.25x real time
    heads = [_admit_long(admission) for _ in range(32)]
    for head in heads:  # each stream's next piece, while its first still plays
        admission.admit(Priority.HIGH, tokens=250.0, chars=100, start_deadline_s=1000.0, queue_limit=1000,
                        kv_usage=0.0, waiting=0, continues=head)
    assert admission.in_flight == 64
    admission.release(heads[0])  # its continuation keeps the stream in flight
    with pytest.raises(APIError) as info:
        _admit_long(admission)
    assert "its 32 streams in flight" in info.value.message


def test_a_continuation_is_admitted_whatever_refuses_new_requests():
    admission = _realtime_admission(rate=25.0)  # one stream's worth of real time
    head = _admit_long(admission)
    load = dict(start_deadline_s=0.001, queue_limit=1, kv_usage=0.99, waiting=3)  # every rule refuses
    with pytest.raises(APIError):
        admission.admit(Priority.LOW, tokens=250.0, chars=100, **load)
    second = admission.admit(Priority.LOW, tokens=250.0, chars=100, continues=head, **load)
    third = admission.admit(Priority.LOW, tokens=250.0, chars=100, continues=second, **load)
    assert third.stream is head and admission.in_flight == 3
    for ticket in (head, second, third):
        admission.release(ticket)
    assert admission.in_flight == 0 and admission.drain_s() == 0.0


def test_the_vocoders_load_is_its_busy_time():
    assert stage_load_s(1.0, t3_busy_s=0.0, t3_steps=0, vocoder_busy_s=0.6) == pytest.approx(0.6)


def test_t3s_load_is_what_its_mean_step_takes_of_a_streams_real_time_pace():
    # busy all along in 4 ms steps: each stream gets 250 tokens/s, ten times real time
    assert stage_load_s(1.0, t3_busy_s=1.0, t3_steps=250, vocoder_busy_s=0.2) == pytest.approx(0.2)
    assert stage_load_s(1.0, t3_busy_s=1.0, t3_steps=250, vocoder_busy_s=0.05) == pytest.approx(0.1)
    # 40 ms steps give each stream exactly real time: busy all along; slower ones count no more
    assert stage_load_s(2.0, t3_busy_s=2.0, t3_steps=50, vocoder_busy_s=0.1) == pytest.approx(2.0)
    assert stage_load_s(2.0, t3_busy_s=2.0, t3_steps=20, vocoder_busy_s=0.1) == pytest.approx(2.0)


def test_t3_stepping_all_along_for_a_few_text_paced_streams_is_not_saturation():
    """16 voice agents: T3 steps all along (3 ms steps), the vocoder is busy 40% of the time and
    the audio delivered follows the agents' text. That is capacity to spare: the real-time bound
    must not learn the delivered 70 s of audio per second as what the server can do (an H100
    then refused 40 of 256 turns at 64 agents as "68 s of audio per second")."""
    admission = _realtime_admission(rate=None)
    for _ in range(12):
        load = stage_load_s(0.25, t3_busy_s=0.25, t3_steps=83, vocoder_busy_s=0.1)
        admission.capacity.observe_delivery(0.25, 0.25 * 70 * 25, busy=True, stage_busy_s=load)
    assert not admission.capacity.saturated and admission.capacity.saturated_rate is None
    assert admission.capacity.rate == pytest.approx(70 * 25 / 0.4)  # extrapolated from the vocoder
    [_admit_long(admission) for _ in range(64)]  # the real-time bound waits for a saturated rate


def test_the_realtime_bound_waits_until_the_busiest_stage_is_saturated():
    admission = _realtime_admission(rate=1000.0)  # 32 streams at 1.25x real time, once saturated
    admission.capacity.observe_delivery(1.0, 0.0, busy=False, stage_busy_s=0.1)  # mostly idle
    assert not admission.capacity.saturated
    tickets = [_admit_long(admission) for _ in range(40)]  # capacity to spare: the start prediction decides
    for _ in range(8):  # the stages fill up
        admission.capacity.observe_delivery(1.0, 1000.0, busy=True, stage_busy_s=1.0)
    assert admission.capacity.saturated
    with pytest.raises(APIError) as info:
        _admit_long(admission)
    assert info.value.code == "overloaded" and "real time" in info.value.message
    assert len(tickets) == 40


def test_only_windows_saturated_all_along_measure_the_saturated_rate():
    model = _model(rate=None)
    model.observe_delivery(RATE_WINDOW_S, 100.0, busy=True, stage_busy_s=0.2 * RATE_WINDOW_S)  # light load
    assert model.rate == pytest.approx(500.0) and model.saturated_rate is None  # a lower bound only
    for _ in range(4):  # the load rises: saturated from the 4th quarter second on (EWMA 0.44, 0.61, 0.73, 0.81)
        model.observe_delivery(0.25, 500.0, busy=True, stage_busy_s=0.25)
    assert model.saturated and model.saturated_rate is None  # a quarter second saturated so far
    for _ in range(4):
        model.observe_delivery(0.25, 500.0, busy=True, stage_busy_s=0.25)
    assert model.saturated_rate == pytest.approx(2000.0)  # the first whole saturated second


def test_an_idle_moment_restarts_the_saturated_window():
    model = _model(rate=None)
    for _ in range(3):
        model.observe_delivery(0.25, 500.0, busy=True, stage_busy_s=0.25)
    assert model.saturated and model.saturated_rate is None  # three quarters of a window
    model.observe_delivery(0.25, 0.0, busy=False, stage_busy_s=0.25)  # nothing in flight
    for _ in range(3):
        model.observe_delivery(0.25, 500.0, busy=True, stage_busy_s=0.25)
    assert model.saturated_rate is None  # 0.75 s since the restart
    model.observe_delivery(0.25, 500.0, busy=True, stage_busy_s=0.25)
    assert model.saturated_rate == pytest.approx(2000.0)


def test_the_realtime_bound_waits_for_a_rate_measured_at_saturation():
    # a server that has served one paced stream learned 500 tokens/s (20 s of audio per second, a
    # lower bound); a burst saturates it at once, and 14 streams would exceed that rate at 1.25x
    model = _model(rate=None, solo=0.0)
    model.observe_delivery(RATE_WINDOW_S, 100.0, busy=True, stage_busy_s=0.2 * RATE_WINDOW_S)
    admission = Admission(1000, 0.98, 1, capacity=model, max_retry_after_s=30, realtime_headroom=1.25)
    for _ in range(4):
        model.observe_delivery(0.25, 100.0, busy=True, stage_busy_s=0.25)
    assert model.saturated and model.saturated_rate is None  # saturated by the 4th quarter second
    assert 20 * 25 * 1.25 > model.rate  # the plain rate (470 tokens/s) would refuse from the 16th stream on
    tickets = [_admit_long(admission) for _ in range(20)]  # the predicted start alone decides
    for _ in range(3):  # the rest of the first saturated second: 1,825 tokens/s, 58 streams at 1.25x
        model.observe_delivery(0.25, 575.0, busy=True, stage_busy_s=0.25)
    assert model.saturated_rate == pytest.approx(100.0 + 3 * 575.0)
    tickets += [_admit_long(admission) for _ in range(38)]
    with pytest.raises(APIError) as info:
        _admit_long(admission)
    assert "its 58 streams in flight" in info.value.message and "(73 s of audio per second)" in info.value.message


def test_the_utilization_is_an_average_over_busy_and_idle_observations():
    model = _model()
    assert model.utilization is None and model.saturated  # unknown: the bound applies
    model.observe_delivery(1.0, 0.0, busy=False, stage_busy_s=0.0)
    assert model.utilization == 0.0
    model.observe_delivery(1.0, 50.0, busy=True, stage_busy_s=3.0)  # overlapping timers count as 1
    assert model.utilization == pytest.approx(0.3)
    assert model.rate == pytest.approx(0.7 * 100.0 + 0.3 * 50.0)  # an idle observation is no rate sample


def test_saturation_holds_through_a_dip_and_ends_when_the_stages_go_quiet():
    model = _model()
    for _ in range(10):
        model.observe_delivery(1.0, 100.0, busy=True, stage_busy_s=1.0)
    assert model.saturated
    model.observe_delivery(1.0, 100.0, busy=True, stage_busy_s=0.4)  # a dip: 0.3 x 0.4 + 0.7 x 1 = 0.82
    model.observe_delivery(1.0, 100.0, busy=True, stage_busy_s=0.4)  # 0.69: below entry, above exit
    assert model.utilization < 0.75 and model.saturated
    for _ in range(3):
        model.observe_delivery(1.0, 0.0, busy=False, stage_busy_s=0.0)
    assert model.utilization < 0.5 and not model.saturated
    model.observe_delivery(1.0, 100.0, busy=True, stage_busy_s=1.0)  # 0.3 x 1 + 0.7 x 0.24 = 0.47
    assert not model.saturated  # below entry: not yet


def _row_wait_by_definition(works: list[Work], rows: int, max_rows: int) -> float:
    free = max_rows - sum(w.rows for w in works)
    if free >= rows:
        return 0.0
    by_remaining = sorted(works, key=lambda w: w.remaining)
    for work in by_remaining:
        free += work.rows
        if free >= rows:
            return sum(min(w.remaining, work.remaining) for w in works)
    return sum(w.remaining for w in works)


def test_the_in_flight_summary_follows_admissions_deliveries_and_releases():
    rng = random.Random(7)
    summary, works = InFlight(), []
    for step in range(400):
        action = rng.random()
        if action < 0.4 or not works:
            work = Work(tokens=float(rng.choice([50, 100, 100, 100, 300])), rows=rng.choice([1, 2]))
            works.append(work)
            summary.add(work)
        elif action < 0.8:  # ties and overshoot: many equal remainders, some delivered past their tokens
            summary.deliver(rng.choice(works), float(rng.choice([10, 25, 60])))
        else:
            work = works.pop(rng.randrange(len(works)))
            summary.remove(work)
            summary.deliver(work, 5.0)  # audio after release changes nothing in flight
        assert summary.count == len(works) and summary.rows == sum(w.rows for w in works)
        assert summary.remaining == pytest.approx(sum(w.remaining for w in works))
        assert summary.min_remaining() == min((w.remaining for w in works), default=0.0)
        assert summary.ahead(20) == pytest.approx(sum(min(w.remaining, 20) for w in works))
        for rows in (1, 2, 4):
            assert summary.row_wait(rows, 16) == pytest.approx(_row_wait_by_definition(works, rows, 16)), step
        assert summary.row_wait(4, None) == 0.0


def test_admission_keeps_the_summary_of_its_tickets():
    capacity = _model(rate=100.0, solo=0.5)
    admission = Admission(100, 0.98, 1, capacity=capacity, max_retry_after_s=30)
    tickets = [admission.admit(Priority.HIGH, tokens=t, chars=10, start_deadline_s=1000.0, queue_limit=100,
                               kv_usage=0.0, waiting=0) for t in (100.0, 300.0, 50.0)]
    admission.delivered(tickets[1], 24000 * 4, 24000)  # 4 s of audio: 100 tokens
    admission.release(tickets[2])
    assert admission.drain_s() == pytest.approx((100 + 200) / 100)
    assert capacity.estimate(0.0, [t.work for t in tickets[:2]]).drain_s == pytest.approx(admission.drain_s())
    admission.release(tickets[0])
    admission.release(tickets[1])
    assert admission.drain_s() == 0.0 and admission.in_flight == 0



def _refused(admission: Admission, priority: Priority, tokens: float, rows: int, load: dict) -> APIError | None:
    """What admit answers such a request (a ticket it hands out is given back)."""
    try:
        admission.release(admission.admit(priority, tokens=tokens, chars=1, rows=rows, **load))
    except APIError as error:
        return error
    return None


def test_an_early_refusal_makes_no_reference_cycle():
    """The refusal is handed on as a value without its traceback, whose frames (the caller's
    too, holding the refusal) would make a cycle of every early refusal for the cyclic collector."""
    admission = Admission(100, 0.9, 1, capacity=_model(rate=None, solo=0.5), max_retry_after_s=30)
    load = dict(start_deadline_s=5.0, queue_limit=1, kv_usage=0.0, waiting=0)
    admission.admit(Priority.HIGH, tokens=20.0, chars=10, **load)  # the queue (1) is full

    def refuse_early() -> int:  # the ASGI app keeps the refusal in a local as it answers
        refusal = admission.certain_refusal(Priority.LOW, **load)
        assert refusal is not None
        return refusal.status

    gc.collect()
    gc.disable()
    try:
        assert [refuse_early() for _ in range(5)] == [429] * 5
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_certain_refusal_is_what_every_request_of_that_priority_would_get():
    rng = random.Random(11)
    refusals = 0
    for trial in range(300):
        model = _model(rate=rng.choice([None, 50.0, 400.0, 2000.0]), solo=rng.choice([0.1, 0.5, 2.0]))
        model.max_rows = rng.choice([None, 4, 16])
        admission = Admission(100, 0.9, 1, capacity=model, max_retry_after_s=30,
                              realtime_headroom=rng.choice([0.0, 1.25]), policy=rng.choice(["predicted", "queue"]))
        load = dict(start_deadline_s=rng.choice([1.0, 5.0]), queue_limit=rng.choice([4, 16, 100]),
                    kv_usage=rng.choice([0.5, 0.95]), waiting=rng.choice([0, 2]))
        for _ in range(rng.randrange(12)):  # what is in flight: whatever got in
            try:
                admission.admit(rng.choice(list(Priority)), tokens=float(rng.choice([20, 200, 600])), chars=50,
                                rows=rng.choice([1, 2]), **load)
            except APIError:
                pass
        in_flight = admission.in_flight
        if admission.certain_refusal(Priority.LOW, **load) is None:  # what SpeechService.refusing relies on
            assert all(admission.certain_refusal(p, **load) is None for p in Priority), trial
        for priority in Priority:
            certain = admission.certain_refusal(priority, **load)
            assert admission.in_flight == in_flight  # it takes nothing
            cheapest = _refused(admission, priority, 0.0, 1, load)
            assert (certain is None) == (cheapest is None), trial
            if certain is None:
                continue
            refusals += 1
            assert (certain.status, certain.code, certain.headers) == (cheapest.status, cheapest.code, cheapest.headers)
            for tokens, rows in ((50.0, 1), (600.0, 2), (2000.0, 4)):  # and so would every costlier one
                assert _refused(admission, priority, tokens, rows, load) is not None, trial
    assert refusals > 100  # the states drawn do refuse, by every rule
