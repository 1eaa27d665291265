"""Which job's pass runs first: higher priority, then earliest deadline first (first audio, then the
stream that would run dry soonest)."""
from __future__ import annotations

import pytest
import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.models import random_tokens, random_voice


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stage(s3gen, clock, margin: float = 0.0) -> VocoderStage:
    return VocoderStage(s3gen, VocoderConfig(max_batch_items=1, first_window_tokens=10, max_window_tokens=10,
                                             playback_margin_s=margin), clock=clock)


def test_a_stream_waiting_for_its_first_audio_goes_before_one_with_audio_to_spare(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock)
    stage.add("ahead", voice, seed=1, streaming=True, n_steps=1)
    stage.push("ahead", random_tokens(60, seed=1))
    [out] = stage.step()  # its first window: 10 tokens = 0.4 s of audio, minus the held cross-fade
    assert out.job_id == "ahead" and out.samples.numel() > 0
    clock.now = 0.1  # "ahead" has audio until about 0.3 s; "new" has none
    stage.add("new", voice, seed=2, streaming=True, n_steps=1)
    stage.push("new", random_tokens(30, seed=2))
    assert [o.job_id for o in stage.step()] == ["new"]


def test_a_playing_stream_inside_the_margin_goes_before_a_new_one(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock, margin=1.0)
    stage.add("ahead", voice, seed=1, streaming=True, n_steps=1)
    stage.push("ahead", random_tokens(60, seed=1))
    stage.step()
    clock.now = 0.1  # "ahead" has about 0.2 s in hand, less than the 1 s margin
    stage.add("new", voice, seed=2, streaming=True, n_steps=1)
    stage.push("new", random_tokens(30, seed=2))
    assert [o.job_id for o in stage.step()] == ["ahead"]


def test_a_stream_about_to_run_dry_goes_before_a_later_arrival_with_none(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock)
    stage.add("old", voice, seed=1, streaming=True, n_steps=1)
    stage.push("old", random_tokens(60, seed=1))
    stage.step()
    clock.now = 5.0  # "old" ran dry long ago; "late" arrived just now
    stage.add("late", voice, seed=2, streaming=True, n_steps=1)
    stage.push("late", random_tokens(30, seed=2))
    assert [o.job_id for o in stage.step()] == ["old"]


def _heard_piece(stage, clock, listener: str) -> None:
    """A listener's first piece, vocoded to its end at t = 0: about 0.5 s of audio in its ears."""
    stage.add("piece0", random_voice(10, seed=1), seed=1, streaming=True, n_steps=1, listener=listener)
    stage.push("piece0", random_tokens(12, seed=1), final=True)
    [out] = stage.step()
    assert out.final and out.samples.numel() > 0.4 * 24_000


def test_a_later_piece_with_audio_still_to_be_heard_goes_after_a_new_stream(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock)
    _heard_piece(stage, clock, "turn")
    clock.now = 0.1
    stage.add("piece1", voice, seed=2, streaming=True, n_steps=1, listener="turn")  # due when piece0 runs out
    stage.push("piece1", random_tokens(30, seed=2))
    clock.now = 0.2
    stage.add("new", voice, seed=3, streaming=True, n_steps=1)  # its listener is waiting for it now
    stage.push("new", random_tokens(30, seed=3))
    assert [o.job_id for o in stage.step()] == ["new"]


def test_a_later_piece_whose_listener_ran_dry_is_due_since_it_was_added(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock)
    _heard_piece(stage, clock, "turn")
    clock.now = 5.0  # the first piece was heard long ago
    stage.add("piece1", voice, seed=2, streaming=True, n_steps=1, listener="turn")
    stage.push("piece1", random_tokens(30, seed=2))
    clock.now = 5.1
    stage.add("new", voice, seed=3, streaming=True, n_steps=1)
    stage.push("new", random_tokens(30, seed=3))
    assert [o.job_id for o in stage.step()] == ["piece1"]


def test_a_listener_changes_when_a_stream_is_vocoded_not_its_audio(tiny_turbo):
    voice, tokens = random_voice(10, seed=1), random_tokens(40, seed=2)

    def audio(listener):
        stage = _stage(tiny_turbo, FakeClock())
        if listener is not None:
            _heard_piece(stage, FakeClock(), listener)
        stage.add("piece1", voice, seed=2, streaming=True, n_steps=1, listener=listener)
        stage.push("piece1", tokens, final=True)
        pieces = []
        while stage.has_work():
            pieces += [o.samples for o in stage.step()]
        return torch.cat(pieces)

    assert torch.equal(audio("turn"), audio(None))


def test_without_streams_passes_run_in_arrival_order(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock)
    for i, job in enumerate(("first", "second")):
        clock.now = float(i)
        stage.add(job, voice, seed=i, streaming=False, n_steps=1)
        stage.push(job, random_tokens(12, seed=i), final=True)
    assert [o.job_id for o in stage.step()] == ["first"]


def test_a_higher_priority_job_goes_before_an_earlier_deadline(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _stage(tiny_turbo, clock)
    stage.add("low", voice, seed=1, streaming=False, n_steps=1, priority=2)
    stage.push("low", random_tokens(12, seed=1), final=True)
    clock.now = 1.0
    stage.add("high", voice, seed=2, streaming=False, n_steps=1, priority=0)
    stage.push("high", random_tokens(12, seed=2), final=True)
    assert [o.job_id for o in stage.step()] == ["high"]


def _ready_streams(stage, count: int) -> None:
    for i in range(count):
        stage.add(f"s{i}", random_voice(10, seed=1), seed=i, streaming=True, n_steps=1)
        stage.push(f"s{i}", random_tokens(30, seed=i))


def test_while_streams_run_a_pass_is_held_to_the_time_budget(tiny_turbo):
    stage = VocoderStage(tiny_turbo, VocoderConfig(max_batch_items=8, first_window_tokens=10, max_pass_seconds=0.05),
                         clock=FakeClock())
    stage.cost.observe(100, 100, flow_seconds=0.01, hift_seconds=0.01)  # 1e-4 s per padded token and frame
    _ready_streams(stage, 6)
    # a first window: 10 prompt + 13 tokens -> 23 padded tokens and 20 frames per item, ~0.004 s per item
    assert len(stage.step()) == 6
    slow = VocoderStage(tiny_turbo, VocoderConfig(max_batch_items=8, first_window_tokens=10, max_pass_seconds=0.01),
                        clock=FakeClock())
    slow.cost.observe(100, 100, flow_seconds=0.01, hift_seconds=0.01)
    _ready_streams(slow, 6)
    assert len(slow.step()) == 2  # 2 items ~0.0086 s fit; a third would not


def test_a_pass_ends_before_the_most_urgent_playing_stream_runs_dry(tiny_turbo):
    clock = FakeClock()
    stage = VocoderStage(tiny_turbo, VocoderConfig(max_batch_items=8, first_window_tokens=10, max_pass_seconds=0.4,
                                                   playback_margin_s=0.0), clock=clock)
    stage.add("playing", random_voice(10, seed=1), seed=1, streaming=True, n_steps=1)
    stage.push("playing", random_tokens(60, seed=1))
    stage.step()  # about 0.4 s of audio out at t = 0
    stage.cost.observe(100, 100, flow_seconds=0.01, hift_seconds=0.01)
    clock.now = 0.1  # ~0.22 s left of its audio (0.4 s less the 0.08 s cross-fade held back)
    _ready_streams(stage, 5)
    assert stage._pass_budget(clock.now, {}) == pytest.approx(0.4 - 4 * 480 / 24000 - 0.1, abs=0.02)
    clock.now = 0.39  # it is about to run dry: no smaller pass can save it, so half the limit
    assert stage._pass_budget(clock.now, {}) == pytest.approx(0.2)


def _follower_stage(s3gen, clock) -> VocoderStage:
    return VocoderStage(s3gen, VocoderConfig(max_batch_items=4, first_window_tokens=10, max_window_tokens=40,
                                             follower_first_window_tokens=30, playback_margin_s=0.0), clock=clock)


def test_a_follower_starts_with_its_own_first_window(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _follower_stage(tiny_turbo, clock)
    _heard_piece(stage, clock, "turn")  # about 0.5 s of audio ahead of the next piece
    clock.now = 0.1
    stage.add("piece1", voice, seed=2, streaming=True, n_steps=1, listener="turn")
    stage.push("piece1", random_tokens(20, seed=2))  # past a first window of 10 (+3), short of 30 (+3)
    assert not stage.has_work()
    stage.push("piece1", random_tokens(14, seed=3))
    assert stage.has_work()


def test_a_stream_whose_listener_has_nothing_ahead_is_no_follower(tiny_turbo):
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _follower_stage(tiny_turbo, clock)
    _heard_piece(stage, clock, "turn")
    clock.now = 5.0  # heard to the end: the listener waits for this piece
    stage.add("piece1", voice, seed=2, streaming=True, n_steps=1, listener="turn")
    stage.push("piece1", random_tokens(14, seed=2))
    assert stage.has_work()


def test_a_requests_later_chunks_added_with_its_first_are_followers_whatever_the_time(tiny_turbo):
    # a streamed request's chunks are added together, so its later chunks' windows (and audio)
    # never depend on timing: a seed reproduces the stream with followers on
    clock, voice = FakeClock(), random_voice(10, seed=1)
    stage = _follower_stage(tiny_turbo, clock)
    clock.now = 100.0  # long after anything was heard
    for name in ("chunk0", "chunk1"):
        stage.add(name, voice, seed=2, streaming=True, n_steps=1, listener="request")
        stage.push(name, random_tokens(20, seed=2))  # past a first window of 10 (+3), short of 30 (+3)
    assert {out.job_id for out in stage.step()} == {"chunk0"} and not stage.has_work()  # chunk1 waits for 33


@pytest.mark.parametrize("value", [0, 41])
def test_a_follower_window_outside_1_to_the_largest_window_is_refused(value):
    with pytest.raises(ValueError, match="follower_first_window_tokens"):
        VocoderConfig(first_window_tokens=10, max_window_tokens=40, follower_first_window_tokens=value)
