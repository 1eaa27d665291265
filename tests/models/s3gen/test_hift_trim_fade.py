"""Start-of-utterance trim and raised-cosine fade-in applied to every S3Gen waveform."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from chorus.models.s3gen.postprocess import apply_trim_fade, apply_trim_fade_at, trim_fade_envelope


def test_trim_fade_envelope_is_20ms_silence_then_20ms_raised_cosine():
    envelope = trim_fade_envelope(24000)
    assert envelope.shape == (960,) and envelope.dtype == torch.float32
    assert envelope[:481].abs().max().item() == 0.0  # the fade starts at exactly 0
    assert envelope[-1].item() == pytest.approx(1.0, abs=1e-7)
    k = torch.arange(480, dtype=torch.float64)
    expected = (1 - torch.cos(math.pi * k / 479)) / 2
    assert (envelope[480:].double() - expected).abs().max().item() <= 1e-6


def test_trim_fade_changes_only_the_first_40ms_and_not_the_input():
    wav = torch.randn(2, 3000)
    original = wav.clone()
    out = apply_trim_fade(wav)
    assert torch.equal(wav, original)
    assert torch.equal(out[:, 960:], wav[:, 960:])
    assert torch.equal(out[:, :960], wav[:, :960] * trim_fade_envelope())


def test_trim_fade_handles_waveforms_shorter_than_the_envelope():
    wav = torch.ones(700)
    out = apply_trim_fade(wav)
    assert torch.equal(out, trim_fade_envelope()[:700])


@pytest.mark.parametrize("cuts", [(0, 3000), (0, 100, 959, 961, 3000), (0, 500, 700)])
def test_trim_fade_in_pieces_equals_the_whole_bitwise(cuts):
    wav = torch.randn(cuts[-1])
    pieces = [wav[a:b].numpy().copy() for a, b in zip(cuts, cuts[1:])]
    for (a, _), piece in zip(zip(cuts, cuts[1:]), pieces):
        apply_trim_fade_at(piece, a)
    assert torch.equal(torch.from_numpy(np.concatenate(pieces)), apply_trim_fade(wav))
