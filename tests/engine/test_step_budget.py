"""A step's prefill positions are bounded by a time target, learned from timed steps
(``SchedulerConfig.step_time_target_s``, ``chorus.engine.step_cost``)."""
from __future__ import annotations

import math

import pytest

from chorus.engine.config import EngineConfig, SchedulerConfig
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.scheduler import Scheduler
from chorus.engine.step_budget import MIN_PREFILL_TOKENS
from chorus.engine.step_cost import StepCostModel
from tests.engine.test_scheduler import BS, Clock, make_request, step

OVERHEAD, PER_ROW, PER_TOKEN = 0.05, 0.002, 0.001  # a made-up device


def device_seconds(out) -> float:
    """What a step takes on the made-up device."""
    decode = int((out.row_num_tokens == 1).sum())
    return OVERHEAD + PER_ROW * decode + PER_TOKEN * (out.total_num_tokens - decode)


def scheduler(target, *, budget=4096, initial=32, max_num_seqs=16, num_blocks=4096):
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=2048,
                             initial_prefill_tokens=initial)
    return Scheduler(config, KVCacheManager(num_blocks, BS), clock=Clock(), step_time_target_s=target)


def timed_step(s):
    """One step whose time on the made-up device is fed to the cost model (as the engine does)."""
    out, results = step(s)
    decode = int((out.row_num_tokens == 1).sum())
    s.step_cost.observe(decode, out.total_num_tokens - decode, device_seconds(out))
    return out, results


def test_the_cost_model_learns_overhead_per_row_and_per_token():
    cost = StepCostModel()
    for rows in (1, 4, 8, 2, 16):
        cost.observe(rows, 0, OVERHEAD + PER_ROW * rows)
    cost.observe(4, 300, OVERHEAD + PER_ROW * 4 + PER_TOKEN * 300)
    assert cost.overhead_s == pytest.approx(OVERHEAD, rel=0.01)
    assert cost.decode_row_s == pytest.approx(PER_ROW, rel=0.01)
    assert cost.prefill_token_s == pytest.approx(PER_TOKEN, rel=0.01)
    assert cost.predict(10, 100) == pytest.approx(OVERHEAD + PER_ROW * 10 + PER_TOKEN * 100, rel=0.01)


def test_steps_that_all_mix_decode_and_prefill_do_not_charge_decode_rows_to_prefill():
    """A burst: no decode-only step, every step has decode rows and a prefill chunk."""
    cost = StepCostModel()
    for rows, tokens in [(2, 100), (6, 40), (12, 20), (9, 64), (4, 200), (12, 8), (7, 30), (11, 90)]:
        cost.observe(rows, tokens, OVERHEAD + PER_ROW * rows + PER_TOKEN * tokens)
    assert cost.prefill_token_s == pytest.approx(PER_TOKEN, rel=0.05)
    assert cost.decode_row_s == pytest.approx(PER_ROW, rel=0.05)


def test_the_budget_grows_at_most_twice_the_largest_timed_prefill():
    cost = StepCostModel()
    for _ in range(5):  # chunks of one size: the fit cannot tell overhead from rate
        cost.observe(0, 100, 1.0)
    cost.prefill_token_s = 1e-6  # as a fit that charged it all to the overhead would have it
    assert cost.prefill_budget(10.0, 0) == 200


def test_the_first_step_before_any_measurement_takes_the_safe_default():
    s = scheduler(0.2, initial=32)
    s.add_request(make_request("long", text_len=1000, max_tokens=4))
    out, _ = step(s)
    assert out.total_num_tokens == 32  # not the 4096 of the token budget


def test_the_budget_adapts_so_each_steps_predicted_time_stays_under_the_target():
    target = 0.2
    s = scheduler(target)
    for i in range(6):
        s.add_request(make_request(f"r{i}", text_len=900, max_tokens=30))
    sizes = []
    while s.has_unfinished_requests():
        before = s.step_cost.prefill_token_s is not None
        out, _ = timed_step(s)
        if before:  # the model had a prefill rate when this step was scheduled
            assert device_seconds(out) <= target * 1.05, out.total_num_tokens
        sizes.append(out.total_num_tokens)
    assert max(sizes) > 100  # it grew from the first 32 positions to what the target allows
    assert max(sizes) < 4096 // 2


def test_decode_rows_advance_every_step_while_a_long_prompt_prefills():
    s = scheduler(0.2)
    s.add_request(make_request("a", text_len=5, max_tokens=200))
    s.add_request(make_request("b", text_len=5, max_tokens=200))
    while s.num_prefilling or s.waiting:
        timed_step(s)
    s.add_request(make_request("long", text_len=1500, max_tokens=4))
    prefill_steps = 0
    while s.get_request("long").num_computed_tokens < s.get_request("long").num_tokens - 1:
        out, _ = timed_step(s)
        rows = out.num_scheduled_tokens
        assert rows["a"] == rows["b"] == 1  # every decode row advances in every step
        prefill_steps += 1
    assert prefill_steps > 3  # the prompt came in chunks


def test_decode_rows_beyond_the_target_still_run_and_prefill_keeps_a_minimum():
    s = scheduler(0.001)  # less than any step takes: the decode rows alone overrun it
    for i in range(4):
        s.add_request(make_request(f"d{i}", text_len=3, max_tokens=200))
    while s.num_prefilling or s.waiting:
        timed_step(s)
    s.add_request(make_request("late", text_len=100, max_tokens=4))
    out, _ = timed_step(s)
    rows = out.num_scheduled_tokens
    assert all(rows[f"d{i}"] == 1 for i in range(4))
    assert rows["late"] == MIN_PREFILL_TOKENS


def test_an_overloaded_step_still_gives_prefill_half_the_target():
    s = scheduler(0.2)
    for _ in range(3):  # 50 ms overhead, 100 ms a decode row, 1 ms a prefill position
        s.step_cost.observe(4, 0, 0.45)  # decode rows alone take longer than the target
        s.step_cost.observe(8, 0, 0.85)
        s.step_cost.observe(0, 100, 0.15)
    assert s.step_cost.prefill_budget(0.2, 8) == 0
    rate = s.step_cost.prefill_token_s
    assert rate == pytest.approx(0.001, rel=0.25)
    assert s.prefill_time_budget(8) == int(0.1 / rate)  # 0.1 s of prefill: half the target


def test_without_a_target_the_token_budget_alone_decides():
    s = scheduler(math.inf, budget=512)
    s.add_request(make_request("long", text_len=1000, max_tokens=4))
    out, _ = step(s)
    assert out.total_num_tokens == 512


@pytest.mark.parametrize("device, want", [("cpu", 1.0), ("cuda", math.inf)])
def test_the_default_target_depends_on_the_device(device, want):
    assert SchedulerConfig().resolved_step_time_target(device) == want
    assert SchedulerConfig(step_time_target_s=3.0).resolved_step_time_target(device) == 3.0


@pytest.mark.parametrize("value", [0, -1.0, True, "1"])
def test_a_bad_target_is_rejected_naming_the_field(value):
    with pytest.raises(ValueError, match="step_time_target_s"):
        SchedulerConfig(step_time_target_s=value)


def test_the_engine_times_its_steps_and_bounds_them(monkeypatch):
    """A real engine (tiny model, CPU) with the made-up device's step times in place of the
    measured ones: after the first timed prefill every step stays within the target."""
    from chorus.engine import engine as engine_module
    from chorus.engine.engine import T3Engine
    from tests.engine.test_engine_parity import _requests
    from tests.engine.tiny_models import tiny

    variant, model = tiny("turbo")
    outputs = []
    real_launch = engine_module.T3Engine._launch

    def launch(self, out, pending):
        outputs.append(out)
        return real_launch(self, out, pending)

    monkeypatch.setattr(engine_module.T3Engine, "_launch", launch)
    monkeypatch.setattr(engine_module._StepTimer, "collected", lambda self, started: device_seconds(outputs[-1]))
    config = EngineConfig.from_flat(variant="turbo", default_deadline_s=None, kv_cache_bytes=64 << 20,
                                    max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=1024,
                                    step_time_target_s=0.1, initial_prefill_tokens=16, async_scheduling=False)
    engine = T3Engine(model, variant, config)
    engine.generate(_requests(variant, 6, seed=3, max_tokens=12))
    assert engine.scheduler.step_cost.prefill_token_s == pytest.approx(PER_TOKEN, rel=0.05)
    assert outputs[0].total_num_tokens <= 16
    assert all(device_seconds(out) <= 0.1 * 1.05 for out in outputs[2:])


def test_without_a_target_steps_are_not_timed():
    """No time target (a GPU's default): the engine keeps no step timers and learns nothing."""
    from chorus.engine.engine import T3Engine
    from tests.engine.test_engine_parity import _requests
    from tests.engine.tiny_models import tiny

    variant, model = tiny("turbo")
    config = EngineConfig.from_flat(variant="turbo", default_deadline_s=None, kv_cache_bytes=64 << 20,
                                    max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=1024,
                                    step_time_target_s=math.inf)
    engine = T3Engine(model, variant, config)
    engine.generate(_requests(variant, 2, seed=3, max_tokens=4))
    assert engine.last_step_seconds is None and engine.scheduler.step_cost.observations == 0
