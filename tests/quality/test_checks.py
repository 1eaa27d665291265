"""The per-request audio checks (chorus/quality/checks.py): each flag is raised by an input made
to have that fault, and a clean input raises none."""
from __future__ import annotations

import math

import numpy as np
import pytest

from chorus.quality.checks import FRAME_SAMPLES, SAMPLE_RATE, AudioCheck, Thresholds, longest_loop

EXPECTED = 1.7 / 25  # seconds per character at the server's default tokens_per_char
TEXT = 60  # characters: about 4 s of speech at the expected rate


def _speech_like(seconds: float = 4.0, seed: int = 0) -> np.ndarray:
    """Voiced bursts (syllables at ~4 Hz) with a 20 % pause: a level and pause share like speech's."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    carrier = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.02 * rng.standard_normal(t.size)
    envelope = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 0.3
    envelope[int(0.8 * t.size):] = 0  # the closing pause
    return (carrier * envelope).astype(np.float32)


def _tokens(count: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 6561, count).tolist()


def _report(audio: np.ndarray, *, chars: int = TEXT, tokens=None, pieces: int = 7):
    check = AudioCheck()
    for piece in np.array_split(audio, pieces):  # delivered in pieces, as a stream is
        assert check.add(piece)
    tokens = [_tokens(int(audio.size / SAMPLE_RATE * 25))] if tokens is None else tokens
    return check.report(text_chars=chars, tokens=tokens, expected_seconds_per_char=EXPECTED)


def test_clean_audio_raises_no_flag():
    report = _report(_speech_like())
    assert report.flags == ()
    assert -30 < report.rms_dbfs < -10 and report.clipped_ratio == 0
    assert 0.1 < report.silent_ratio < 0.6
    assert report.seconds_per_char == pytest.approx(4.0 / TEXT)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_piece_is_refused_and_flagged(bad):
    check = AudioCheck()
    assert check.add(_speech_like(0.5))
    piece = _speech_like(0.5)
    piece[100] = bad
    assert not check.add(piece)
    report = check.report(text_chars=TEXT, tokens=[_tokens(12)], expected_seconds_per_char=EXPECTED)
    assert "nonfinite" in report.flags and report.audio_seconds == pytest.approx(0.5)


def test_clipped_audio_is_flagged():
    audio = np.clip(_speech_like() * 8, -1, 1)  # driven into the rails
    report = _report(audio)
    assert report.clipped_ratio > Thresholds().clipped_ratio and report.flags == ("clipped",)


def test_silent_audio_is_flagged():
    audio = _speech_like()
    audio[: int(0.7 * audio.size)] = 0  # most of it silence
    assert _report(audio).flags == ("silent",)


def test_silence_counts_frames_across_piece_boundaries():
    audio = np.zeros(10 * FRAME_SAMPLES + 7, np.float32)
    check = AudioCheck()
    for piece in np.array_split(audio, 13):  # pieces that are not whole frames
        check.add(piece)
    report = check.report(text_chars=None, tokens=None, expected_seconds_per_char=EXPECTED)
    assert report.silent_ratio == 1.0 and check.frames == 10 and report.rms_dbfs == -math.inf


def test_a_runaway_generation_is_flagged_too_long():
    assert _report(_speech_like(30.0), chars=TEXT).flags == ("too_long",)  # 30 s for 60 characters


def test_a_truncated_generation_is_flagged_too_short():
    assert _report(_speech_like(0.5), chars=TEXT).flags == ("too_short",)  # half a second for 60


def test_the_ratio_is_not_judged_on_short_texts():
    assert "too_long" not in _report(_speech_like(4.0), chars=5).flags  # "Okay." may take a while


def test_a_token_loop_is_flagged():
    tokens = _tokens(40) + [11, 12, 13, 14, 15] * 12 + _tokens(40, seed=1)  # 60 tokens looping a 5-gram
    report = _report(_speech_like(), tokens=[tokens])
    assert report.loop_tokens == 60 and report.flags == ("loop",)


def test_longest_loop_finds_held_tokens_and_needs_three_repeats():
    assert longest_loop([1, 2, 3] + [7] * 30 + [4, 5]) == 30
    assert longest_loop([1, 2, 3, 1, 2, 3, 9, 8]) == 0  # twice is not a loop
    assert longest_loop([1, 2, 3, 1, 2, 3, 1, 2, 3]) == 9
    assert longest_loop(_tokens(500)) == 0
    assert longest_loop([]) == 0


def test_a_voice_conversion_has_no_ratio_and_no_loop():
    check = AudioCheck()
    check.add(_speech_like())
    report = check.report(text_chars=None, tokens=None, expected_seconds_per_char=EXPECTED)
    assert report.seconds_per_char is None and report.loop_tokens is None and report.flags == ()
    assert report.as_dict()["flags"] == []
