"""A listener hears its streams one after another: when the audio before each stream runs out."""
from __future__ import annotations

import math

import pytest
import torch

from chorus.models.s3gen.s3gen import SAMPLE_RATE
from chorus.vocoder.job import Job, new_stream
from chorus.vocoder.listeners import Listeners


def stream_job(job_id: str, added_at: float = 0.0) -> Job:
    """A streaming job with only the bookkeeping the listeners read (no model behind it)."""
    job = Job(job_id, voice=None, seed=0, n_steps=None, cfg_rate=None, rules=None, order=0, added_at=added_at)
    job.stream = new_stream(0, torch.device("cpu"), torch.float32, harmonics=2, first_window=10)
    return job


def sent(job: Job, at: float, seconds: float) -> None:
    """``job`` sent ``seconds`` of audio, its first at ``at`` (as ``VocoderStage._emit`` records)."""
    if job.stream.first_sent_at is None:
        job.stream.first_sent_at = at
    job.stream.sent += round(seconds * SAMPLE_RATE)


def test_a_stream_behind_one_that_has_sent_nothing_is_not_due():
    listeners, first, second = Listeners(), stream_job("a"), stream_job("b")
    listeners.join("turn", first)
    listeners.join("turn", second)
    assert listeners.leads(now=0.0) == {"b": math.inf}


def test_a_stream_plays_after_the_audio_before_it_runs_out():
    listeners, first, second = Listeners(), stream_job("a"), stream_job("b")
    listeners.join("turn", first)
    listeners.join("turn", second)
    sent(first, at=1.0, seconds=2.0)
    assert listeners.leads(now=1.5) == {"b": pytest.approx(3.0)}
    sent(second, at=1.5, seconds=0.5)  # made early: it is heard from 3.0, not from 1.5
    assert second.runs_out_at(3.0) == pytest.approx(3.5)
    assert second.deadline(margin_s=0.2, lead=3.0) == pytest.approx(3.3)


def test_the_lead_outlives_the_stream_that_made_it():
    listeners, first = Listeners(), stream_job("a")
    listeners.join("turn", first)
    sent(first, at=1.0, seconds=2.0)
    listeners.leave("a", finished=True)
    later = stream_job("b", added_at=2.0)  # the turn's next piece, added while the first still plays
    listeners.join("turn", later)
    assert listeners.leads(now=2.0) == {"b": pytest.approx(3.0)}
    assert later.deadline(margin_s=0.5, lead=3.0) == pytest.approx(2.5)


def test_a_stream_finished_before_the_one_ahead_of_it_counts_once_that_one_ends():
    listeners, first, second, third = Listeners(), stream_job("a"), stream_job("b"), stream_job("c")
    for job in (first, second, third):
        listeners.join("request", job)
    sent(first, at=1.0, seconds=1.0)
    sent(second, at=1.2, seconds=3.0)
    listeners.leave("b", finished=True)  # all of it made; heard only after "a"
    assert listeners.leads(now=1.2) == {"b": pytest.approx(2.0), "c": pytest.approx(5.0)}
    sent(first, at=1.0, seconds=0.5)
    listeners.leave("a", finished=True)
    assert listeners.leads(now=1.3) == {"c": pytest.approx(5.5)}


def test_an_aborted_stream_is_dropped_without_moving_the_clock():
    listeners, first, second = Listeners(), stream_job("a"), stream_job("b")
    listeners.join("turn", first)
    listeners.join("turn", second)
    sent(first, at=1.0, seconds=2.0)
    listeners.leave("a", finished=False)
    assert listeners.leads(now=1.5) == {}  # "b" is now first in line, with nothing before it


def test_streams_of_other_listeners_do_not_wait_for_each_other():
    listeners, one, other = Listeners(), stream_job("a"), stream_job("b")
    listeners.join("one", one)
    listeners.join("other", other)
    sent(one, at=1.0, seconds=2.0)
    assert listeners.leads(now=1.5) == {}


def test_a_listener_is_forgotten_once_idle_and_heard_to_the_end():
    listeners, job = Listeners(), stream_job("a")
    listeners.join("turn", job)
    sent(job, at=1.0, seconds=2.0)
    listeners.leave("a", finished=True)
    listeners.leads(now=2.9)
    assert len(listeners) == 1  # its audio still plays: a next piece would be heard after it
    listeners.leads(now=3.0)
    assert len(listeners) == 0
    listeners.leave("a", finished=True)  # leaving twice (a failed job already sent final) is harmless
