"""The reference is timed warm, on evenly spaced chunks worth a minute of audio, and each chunk's
output is checked: the selection and the timing loop on their own, then the reference's own T3
loop on a tiny random model on the CPU (``chorus bench t3 --reference``)."""
from __future__ import annotations

import itertools

import pytest
import torch

from chorus.bench.reference_timing import check_generated, evenly_spaced, select_reference_chunks, time_reference


class TickClock:
    """Each reading is one second after the previous one: a timed call spans exactly one second."""

    def __init__(self):
        self._ticks = itertools.count()

    def __call__(self) -> float:
        return float(next(self._ticks))


def test_evenly_spaced_indices_span_the_workload():
    assert evenly_spaced(145, 4) == [0, 48, 96, 144]
    assert evenly_spaced(5, 9) == [0, 1, 2, 3, 4]
    assert evenly_spaced(7, 1) == [3]


def test_more_chunks_are_timed_until_a_minute_of_audio():
    lengths = [100] * 40  # 4 s of audio each at 25 tokens/s
    indices = select_reference_chunks(lengths, min_chunks=4, min_audio_s=60.0)
    assert len(indices) == 15 and indices[0] == 0 and indices[-1] == 39


def test_at_least_the_requested_chunks_are_timed():
    assert len(select_reference_chunks([2000] * 10, min_chunks=4, min_audio_s=60.0)) == 4


def test_a_short_workload_is_timed_whole():
    assert select_reference_chunks([25, 25, 25], min_chunks=4, min_audio_s=60.0) == [0, 1, 2]


def test_the_warm_up_call_comes_first_and_is_not_counted():
    calls = []
    times = time_reference(lambda i: calls.append(i) or i, [2, 5, 8], clock=TickClock())
    assert calls == [2, 2, 5, 8]  # the warm-up on the first timed chunk, then the timed ones
    assert times.seconds == [1.0, 1.0, 1.0] and times.total_seconds == 3.0
    assert times.warm_up_seconds == 1.0 and times.results == [2, 5, 8]


def test_a_reference_that_missed_its_forced_length_is_refused():
    with pytest.raises(RuntimeError, match="generated 7 speech tokens for chunk 3, not the 9"):
        check_generated(7, 9, 3)


@pytest.mark.oracle
def test_reference_t3_is_warmed_up_and_timed_on_evenly_spaced_chunks(oracle):
    from chorus.bench.reference_t3 import run_reference_t3
    from chorus.bench.t3_bench import T3BenchConfig, load_bench_model
    from chorus.models.variants import tiny_variant
    from tests.models.t3.oracle_t3 import build_oracle_t3

    variant = tiny_variant("turbo", layers=2, hidden=64, heads=4)
    _, _, encoder, voice, _ = load_bench_model(T3BenchConfig(variant=variant, device="cpu"))
    chunks = [f"Chunk number {i} says a few words." for i in range(9)]
    lengths = [3 + i for i in range(9)]
    built = []

    def build(variant, device):
        t3 = build_oracle_t3(variant.t3)
        original = t3.inference_turbo
        calls = []

        def recording(t3_cond, text_tokens, **kwargs):
            calls.append(text_tokens.shape[-1])
            return original(t3_cond, text_tokens, **kwargs)

        t3.inference_turbo = recording
        built.append(calls)
        return t3, None

    report = run_reference_t3(variant, voice, chunks, [encoder.encode(c) for c in chunks], lengths,
                              cfg_weight=0.0, device=torch.device("cpu"), min_chunks=3, min_audio_s=0.0,
                              build=build, clock=TickClock())
    timed = [0, 4, 8]
    assert [c["index"] for c in report["per_chunk"]] == timed
    assert len(built[0]) == len(timed) + 1  # one warm-up call more than the timed ones
    assert report["t3_seconds"] == 3.0  # one tick per timed chunk: the warm-up is not in it
    assert report["speech_tokens"] == sum(lengths[i] for i in timed)  # counted from what it generated
    assert report["method"]["chunks_timed"] == 3
    assert report["method"]["warm_up"].startswith("one untimed t3.inference_turbo() on chunk 0")
    assert report["extrapolated_workload_t3_seconds"] == round(sum(lengths) / (report["speech_tokens"] / 3.0), 1)


@pytest.fixture
def tiny_reference_tts(oracle):
    """A stand-in for the reference TTS object whose ``generate()`` runs the reference's own tiny
    T3 (the part whose length the bench forces); returns (variant, loader, texts generated)."""
    from chatterbox.models.t3.modules.cond_enc import T3Cond

    from chorus.bench.t3_bench import T3BenchConfig, load_bench_model
    from chorus.models.variants import tiny_variant
    from tests.models.t3.oracle_t3 import build_oracle_t3

    variant = tiny_variant("turbo", layers=2, hidden=64, heads=4)
    _, _, encoder, voice, _ = load_bench_model(T3BenchConfig(variant=variant, device="cpu"))
    texts = []

    class TinyReferenceTTS:
        def __init__(self):
            self.t3 = build_oracle_t3(variant.t3)

        def generate(self, text):
            texts.append(text)
            cond = T3Cond(speaker_emb=voice.speaker_embedding, cond_prompt_speech_tokens=voice.t3_prompt_tokens)
            tokens = self.t3.inference_turbo(cond, torch.tensor([encoder.encode(text)]), max_gen_len=32)
            return torch.zeros(1, 960 * tokens.shape[-1])  # 24 kHz audio, 25 tokens per second

    return variant, (lambda *_: TinyReferenceTTS()), texts


CHUNKS = [f"Sentence {i} of the workload." for i in range(6)]


def _run_pipeline_reference(variant, load, lengths):
    from chorus.bench.reference_pipeline import run_reference_pipeline

    return run_reference_pipeline(variant, ".", CHUNKS, lengths, cfg_weight=0.0, device=torch.device("cpu"),
                                  min_chunks=2, min_audio_s=0.0, load=load, clock=TickClock())


@pytest.mark.oracle
def test_reference_generate_is_warmed_up_and_timed_on_evenly_spaced_chunks(tiny_reference_tts):
    variant, load, texts = tiny_reference_tts
    report = _run_pipeline_reference(variant, load, [10] * 6)
    assert texts == [CHUNKS[0], CHUNKS[0], CHUNKS[5]]  # warm-up, then the first and last chunks
    assert report["total_seconds"] == 2.0 and report["chunks"] == 2
    assert report["audio_seconds"] == pytest.approx(2 * 10 / 25)
    assert [c["index"] for c in report["per_chunk"]] == [0, 5]


@pytest.mark.oracle
def test_a_reference_generate_that_stopped_short_is_not_timed(tiny_reference_tts):
    variant, load, _ = tiny_reference_tts
    with pytest.raises(RuntimeError, match="generated 33 speech tokens for chunk 0, not the 40"):
        _run_pipeline_reference(variant, load, [40] * 6)  # its generate() stops at 32 + 1 tokens
