"""Timestamps through the pipeline: each chunk timed inside its exact span of the delivered
audio, by alignment on a Llama T3 that has the alignment heads, by estimate on Turbo; the same
timings streamed and whole; pauses shift the spans; off by default."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.pipeline.config import PipelineConfig
from chorus.pipeline.models import SpeechModels
from chorus.pipeline.pipeline import Pipeline
from chorus.pipeline.request import SpeechRequest
from chorus.timestamps import split_words
from tests.pipeline.tiny_pipeline import aligned_models, tiny_models

TEXT = "The first sentence is here. A second one follows it. And a third closes the text."


def _pipeline(models: SpeechModels, alignment: bool = True) -> Pipeline:
    name = models.variant.name
    engine = EngineConfig(variant=name, alignment=alignment, cache=CacheConfig(kv_cache_bytes=64 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=1024,
                                                    step_time_target_s=math.inf))
    return Pipeline(models, PipelineConfig(engine=engine, max_chars=40)).start()


@pytest.fixture(scope="module")
def original():
    with _pipeline(aligned_models()) as pipe:
        yield pipe


@pytest.fixture(scope="module")
def turbo():
    with _pipeline(tiny_models("turbo")) as pipe:
        yield pipe


def _request(text=TEXT, **kw) -> SpeechRequest:
    return SpeechRequest(text, seed=3, max_new_tokens=30, min_new_tokens=30, normalize=False,
                         timestamps="word", **kw)


def _check_inside_and_ordered(result) -> None:
    """Monotonic, each word a positive interval inside its chunk, every word of every chunk timed."""
    assert len(result.timestamps) == len(result.chunks)
    previous_end = 0.0
    for chunk, timings in zip(result.chunks, result.timestamps):
        assert [(w.char_start, w.char_end) for w in timings.words] == split_words(chunk.text)
        for word in timings.words:
            assert previous_end - 1e-9 <= word.start < word.end <= result.duration + 1e-9
            previous_end = word.end


def test_a_llama_variant_times_words_by_its_alignment(original):
    result = original.submit(_request()).result()
    assert len(result.chunks) > 1
    assert {t.method for t in result.timestamps} == {"alignment"}
    _check_inside_and_ordered(result)


def test_a_llama_variant_estimates_when_its_engine_keeps_no_alignment():
    with _pipeline(aligned_models(), alignment=False) as pipe:
        result = pipe.submit(_request()).result()
    assert {t.method for t in result.timestamps} == {"estimate"}
    _check_inside_and_ordered(result)


def test_turbo_estimates_its_timings(turbo):
    result = turbo.submit(_request()).result()
    assert {t.method for t in result.timestamps} == {"estimate"}
    _check_inside_and_ordered(result)


def test_a_variant_without_the_alignment_heads_estimates():
    with _pipeline(tiny_models("original")) as pipe:  # 2 layers: no alignment heads
        result = pipe.submit(_request("Just a few words here.")).result()
    assert [t.method for t in result.timestamps] == ["estimate"]


def test_each_chunk_is_timed_inside_its_own_span(turbo):
    result = turbo.submit(_request()).result()
    at = 0
    for chunk, timings in zip(result.chunks, result.timestamps):
        start, end = at / result.sample_rate, (at + chunk.num_samples) / result.sample_rate
        assert timings.words[0].start == pytest.approx(start) and timings.words[-1].end == pytest.approx(end)
        at += chunk.num_samples


@pytest.mark.parametrize("which", ["original", "turbo"])
def test_streamed_pieces_carry_the_results_timings(which, request):
    pipe = request.getfixturevalue(which)
    stream = pipe.submit(_request(stream=True))
    carried = [(piece.chunk_index, piece.timings) for piece in stream if piece.timings is not None]
    result = stream.result()
    assert carried == list(enumerate(result.timestamps))


def test_a_pause_shifts_the_chunks_after_it(turbo):
    result = turbo.submit(_request('Before the pause. <break time="500ms"/> After the pause.')).result()
    (first, samples), = result.pauses
    before, after = result.timestamps
    assert before.words[-1].end <= first / result.sample_rate
    assert after.words[0].start == pytest.approx((first + samples) / result.sample_rate)


def test_timestamps_are_off_by_default(original):
    request = replace(_request(), timestamps=None)
    plan = original.planner.plan(request)
    assert not plan.wants_alignment
    stream = original.submit(plan)
    assert all(piece.timings is None for piece in stream)
    assert stream.result().timestamps == ()


def test_a_bad_timestamps_value_is_refused(turbo):
    with pytest.raises(ValueError, match="timestamps must be one of word, character"):
        turbo.planner.plan(replace(_request(), timestamps="sentence"))
