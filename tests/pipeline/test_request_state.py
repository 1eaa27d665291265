"""A request's two deadlines as the vocoder thread checks them (``chorus.pipeline.request_state``);
tests/pipeline/test_pipeline.py checks that an expired one fails the request and frees its work."""
from __future__ import annotations

from chorus.pipeline.request_state import Deadlines


def test_the_start_deadline_passes_while_no_audio_was_delivered():
    assert Deadlines(100.0, start_s=2.0, total_s=None).expired(102.5, audio_started=False) == (
        "start", "no audio within its start deadline (2 s)")


def test_the_start_deadline_stops_applying_once_audio_flows():
    assert Deadlines(100.0, start_s=2.0, total_s=None).expired(150.0, audio_started=True) is None


def test_the_total_deadline_passes_even_while_audio_flows():
    assert Deadlines(100.0, start_s=2.0, total_s=10.0).expired(110.5, audio_started=True) == (
        "total", "not finished within its total deadline (10 s)")


def test_no_deadline_passes_before_its_time():
    assert Deadlines(100.0, start_s=2.0, total_s=10.0).expired(101.9, audio_started=False) is None
