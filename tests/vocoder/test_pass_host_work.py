"""A streaming pass's host work is a fixed set of tensor calls, not a set per stream: on a server
each tensor call can wait for the GIL behind T3's thread (docs/vocoder.md, "A pass's host work")."""
from __future__ import annotations

from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.conftest import drain
from tests.vocoder.models import random_tokens, random_voice
from tests.vocoder.tensor_calls import TensorCalls


def _first_pass_calls(s3gen, streams: int, voices: int) -> int:
    """Host tensor calls (model calls apart) of the pass over ``streams`` first windows, which
    use ``voices`` distinct voices."""
    config = VocoderConfig()
    stage = VocoderStage(s3gen, config)
    prompts = [random_voice(30, seed=1 + v) for v in range(voices)]
    end = config.first_window_tokens + config.holdback_tokens + 1
    for v, voice in enumerate(prompts):  # first uses (the voice cache, cached envelopes) come before
        stage.add(f"warm{v}", voice, seed=99, streaming=True)
        stage.push(f"warm{v}", random_tokens(end, seed=99), final=True)
    drain(stage)
    for i in range(streams):
        stage.add(f"s{i}", prompts[i % voices], seed=i, streaming=True)
        stage.push(f"s{i}", random_tokens(end, seed=10 + i))
    with TensorCalls.for_passes(stage) as counter:
        pieces = stage.step()
    assert len(pieces) == streams and all(p.samples.numel() for p in pieces)
    return counter.host_total


def test_a_pass_makes_as_many_tensor_calls_for_eight_streams_as_for_two(tiny_turbo):
    assert _first_pass_calls(tiny_turbo, 8, voices=1) == _first_pass_calls(tiny_turbo, 2, voices=1)


def test_each_further_voice_in_a_pass_costs_one_tensor_call(tiny_turbo):
    assert _first_pass_calls(tiny_turbo, 6, voices=3) == _first_pass_calls(tiny_turbo, 6, voices=1) + 2
