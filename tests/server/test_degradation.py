"""The degradation policy on its own: levels, hold time, hysteresis, and what each level changes."""
from __future__ import annotations

from chorus.models.variants import get_variant
from chorus.pipeline.request import SpeechRequest
from chorus.server.config import DegradationConfig
from chorus.server.degradation import DegradationPolicy

CONFIG = DegradationConfig(thresholds=(0.6, 0.75, 0.9), hysteresis=0.1, hold_s=2.0, reduced_flow_steps=5)


def test_a_level_is_entered_only_after_the_hold_time():
    policy = DegradationPolicy(CONFIG)
    assert policy.update(0.7, now=0.0) == 0
    assert policy.update(0.7, now=1.9) == 0
    assert policy.update(0.7, now=2.0) == 1


def test_a_short_burst_does_not_degrade():
    policy = DegradationPolicy(CONFIG)
    policy.update(0.95, now=0.0)
    policy.update(0.1, now=1.0)
    assert policy.update(0.95, now=2.5) == 0


def test_levels_climb_one_at_a_time():
    policy = DegradationPolicy(CONFIG)
    levels = [policy.update(0.95, now=t) for t in (0.0, 2.0, 2.0, 4.0, 4.0, 6.0, 8.0)]
    assert levels == [0, 1, 1, 2, 2, 3, 3]


def test_leaving_a_level_needs_pressure_below_the_hysteresis_band():
    policy = DegradationPolicy(CONFIG)
    policy.update(0.7, now=0.0)
    assert policy.update(0.7, now=2.0) == 1
    assert policy.update(0.55, now=3.0) == 1  # below 0.6 but inside the 0.1 band
    assert policy.update(0.55, now=10.0) == 1
    policy.update(0.45, now=11.0)
    assert policy.update(0.45, now=13.0) == 0


def test_level_one_reduces_flow_steps_of_the_original():
    policy = DegradationPolicy(CONFIG)
    policy.level = 1
    request, applied = policy.apply(SpeechRequest("Hi."), get_variant("original"))
    assert request.flow_steps == 5 and request.cfg_weight is None
    assert applied.changes == ("flow_steps=5",)


def test_level_one_never_raises_steps_a_client_chose_lower():
    policy = DegradationPolicy(CONFIG)
    policy.level = 1
    request, applied = policy.apply(SpeechRequest("Hi.", flow_steps=3), get_variant("original"))
    assert request.flow_steps == 3 and applied.changes == ()


def test_level_two_turns_cfg_off_where_the_variant_uses_it():
    policy = DegradationPolicy(CONFIG)
    policy.level = 2
    request, applied = policy.apply(SpeechRequest("Hi."), get_variant("original"))
    assert request.cfg_weight == 0.0 and applied.changes == ("flow_steps=5", "cfg_weight=0")
    request, applied = policy.apply(SpeechRequest("Hi."), get_variant("turbo"))
    assert request.cfg_weight is None and applied.changes == ("flow_steps=1",)


def test_level_three_shrinks_the_queue():
    policy = DegradationPolicy(CONFIG)
    assert policy.queue_limit(100) == 100
    policy.level = 3
    assert policy.queue_limit(100) == 50


def test_disabled_policy_stays_at_zero():
    policy = DegradationPolicy(DegradationConfig(enabled=False))
    assert policy.update(1.0, now=0.0) == 0 and policy.update(1.0, now=100.0) == 0
