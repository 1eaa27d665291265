"""Holding a pass back for a first window about to be ready (``VocoderConfig.first_window_hold_s``)."""
from __future__ import annotations

import pytest

from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.models import random_tokens, random_voice


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stage(s3gen, clock, hold_s: float = 0.05, margin: float = 0.0) -> VocoderStage:
    return VocoderStage(s3gen, VocoderConfig(max_batch_items=4, first_window_tokens=10, max_window_tokens=10,
                                             playback_margin_s=margin, first_window_hold_s=hold_s), clock=clock)


def _playing_and_new(stage, clock, new_tokens: int = 10, listener: str | None = None) -> None:
    """``playing`` sent its first window (0.4 s of audio) at t = 0 and has its next one ready; at
    t = 0.11 ``new`` has ``new_tokens`` of the 14 its first window needs (10 and 3 of right
    context), and T3 makes a token every 2 ms."""
    voice = random_voice(10, seed=1)
    stage.add("playing", voice, seed=1, streaming=True, n_steps=1, listener=listener)
    stage.push("playing", random_tokens(60, seed=1))
    [out] = stage.step()
    assert out.job_id == "playing" and out.samples.numel() > 0
    clock.now = 0.11
    stage.add("new", voice, seed=2, streaming=True, n_steps=1, listener=listener)
    stage.push("new", random_tokens(30, seed=2)[:new_tokens])
    stage.observe_token_interval(0.002)


def test_a_pass_is_held_for_a_first_window_about_to_be_ready_and_takes_it_along(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock)
    _playing_and_new(stage, clock)  # "new": 4 tokens short, 8 ms away at 2 ms a token
    assert not stage.has_work()  # "playing" is ready, but "new"'s window comes first
    assert stage.stats.holds == 1
    clock.now = 0.12
    stage.push("new", random_tokens(30, seed=2)[10:14])
    assert stage.has_work()
    assert sorted(out.job_id for out in stage.step()) == ["new", "playing"]
    assert stage.stats.hold_seconds == pytest.approx(0.01)


def test_a_hold_ends_after_first_window_hold_s(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock)
    _playing_and_new(stage, clock)
    assert not stage.has_work()
    clock.now = 0.11 + 0.05  # T3 pushed nothing more
    assert stage.has_work()
    assert [out.job_id for out in stage.step()] == ["playing"]
    assert stage.stats.hold_seconds == pytest.approx(0.05)


def test_a_window_further_away_than_the_hold_is_not_waited_for(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock, hold_s=0.005)  # "new" is 8 ms away
    _playing_and_new(stage, clock)
    assert stage.has_work()
    assert stage.stats.holds == 0


def test_a_ready_stream_due_before_the_window_is_not_held(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock, margin=1.0)  # "playing" has less than the margin in hand: due now
    _playing_and_new(stage, clock)
    assert stage.has_work()
    assert stage.stats.holds == 0


def test_a_follower_with_audio_ahead_of_it_is_not_waited_for(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock)
    _playing_and_new(stage, clock, listener="turn")  # "new" is heard after "playing": no one waits for it yet
    assert stage.has_work()
    assert stage.stats.holds == 0


def test_a_ready_first_window_is_never_held(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock)
    _playing_and_new(stage, clock, new_tokens=14)  # "new" is ready itself
    assert stage.has_work()
    assert stage.stats.holds == 0


def test_nothing_is_held_before_t3s_pace_was_observed(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock)
    _playing_and_new(stage, clock)
    stage.token_interval = None
    assert stage.has_work()


def test_t3s_pace_is_weighted_over_its_observations(tiny_turbo):
    stage = _stage(tiny_turbo, FakeClock())
    stage.observe_token_interval(0.010)
    stage.observe_token_interval(0.005)
    assert stage.token_interval == pytest.approx(0.009)


def test_by_default_passes_are_not_held(tiny_turbo):
    clock = FakeClock()
    stage = _stage(tiny_turbo, clock, hold_s=0.0)
    _playing_and_new(stage, clock)
    assert stage.has_work()
    assert stage.stats.holds == 0


@pytest.mark.parametrize("value", [-0.01, float("inf"), float("nan"), True, "0.05"])
def test_a_hold_that_is_not_a_number_of_seconds_is_refused(value):
    with pytest.raises(ValueError, match="first_window_hold_s"):
        VocoderConfig(first_window_hold_s=value)
