"""``chorus bench offline`` / ``stream`` measure what they claim, on tiny models on the CPU (so
the benchmark cannot rot between GPU runs)."""
from __future__ import annotations

import contextlib
import gc
import threading

import pytest

from chorus.bench.pipeline_bench import PipelineBenchConfig, _pipeline, _warm_up, bench_offline, bench_stream
from tests.pipeline.tiny_pipeline import tiny_models

CHUNKS = ["Hello there, this is the first chunk.", "And here is a second one."]


def test_offline_reports_every_stage_and_honours_fixed_lengths():
    models = tiny_models("turbo")
    cfg = PipelineBenchConfig(variant="turbo", tokens_per_char=0.5, max_num_seqs=16,
                              max_num_batched_tokens=2048, max_model_len=1024)
    report = bench_offline(models, cfg, CHUNKS)
    assert report["chunks"] == 2
    assert report["speech_tokens"] == sum(round(0.5 * len(c)) for c in CHUNKS)
    assert report["audio_seconds"] > 0 and report["total_seconds"] > 0
    assert report["t3_seconds"] > 0 and report["s3gen_seconds"] > 0
    assert abs(report["x_realtime"] - report["audio_seconds"] / report["total_seconds"]) < 0.2


def test_offline_counts_only_the_timed_run_and_its_passes_add_up():
    models = tiny_models("turbo")
    cfg = PipelineBenchConfig(variant="turbo", tokens_per_char=0.5, max_num_seqs=16,
                              max_num_batched_tokens=2048, max_model_len=1024)
    report = bench_offline(models, cfg, CHUNKS)
    timeline = report["timeline"]
    assert report["vocoder_items"] == len(CHUNKS)  # the warm-up's jobs are not counted
    assert len(timeline["passes"]) == report["vocoder_passes"] >= 1
    assert sum(p["items"] for p in timeline["passes"]) == len(CHUNKS)
    parts = timeline["during_t3"], timeline["after_t3"]
    assert sum(part["passes"] for part in parts) == report["vocoder_passes"]
    wall = report["total_seconds"] + 1e-3  # rounded to the millisecond, the times to 0.1 ms
    assert 0 < timeline["t3_last_step_end_s"] <= wall
    assert all(0 < p["end_s"] <= wall for p in timeline["passes"])
    assert abs(sum(p["seconds"] for p in timeline["passes"]) - report["s3gen_seconds"]) < 1e-3


def test_stream_reports_time_to_first_audio_per_concurrency_level():
    models = tiny_models("original")
    cfg = PipelineBenchConfig(variant="original", tokens_per_char=0.4, max_num_seqs=16,
                              max_num_batched_tokens=2048, max_model_len=1024, flow_steps=2)
    pipe = _pipeline(models, cfg)
    try:
        _warm_up(pipe, models, cfg)
        levels = [bench_stream(pipe, models, cfg, n) for n in (1, 3)]
    finally:
        pipe.close()
    for level, n in zip(levels, (1, 3)):
        assert level["concurrency"] == n and level["num_errors"] == 0
        assert 0 < level["ttfa_s"]["p50"] <= level["ttfa_s"]["max"] < level["wall_seconds"] + 1e-6
        assert 0 < level["first_token_s"]["p50"] <= level["ttfa_s"]["max"]
        assert level["rtf"]["min"] > 0
        assert 0 <= level["streams_faster_than_realtime"] <= n
    assert not pipe.engine.has_unfinished_requests()


def _turbo_stream_level(concurrency: int, around=contextlib.nullcontext) -> dict:
    """One level of ``concurrency`` streams on a warmed tiny turbo pipeline, inside ``around()``
    (entered after the warm-up)."""
    models = tiny_models("turbo")
    cfg = PipelineBenchConfig(variant="turbo", tokens_per_char=0.4, max_num_seqs=16,
                              max_num_batched_tokens=2048, max_model_len=1024)
    pipe = _pipeline(models, cfg)
    try:
        _warm_up(pipe, models, cfg)
        with around():
            return bench_stream(pipe, models, cfg, concurrency)
    finally:
        pipe.close()


def test_stream_level_reports_the_vocoder_work_of_that_level_only():
    level = _turbo_stream_level(2)
    assert level["num_errors"] == 0 and level["audio_seconds"] > 0
    assert level["vocoder_passes"] >= 1 and level["vocoder_items"] >= 2  # at least one pass per stream
    # both sides rounded: busy to the millisecond, audio to 10 ms
    assert level["s3gen_busy_per_audio_s"] == pytest.approx(level["s3gen_busy_s"] / level["audio_seconds"], rel=0.01)
    # every pass reads the voice prompt beside the stream's tokens: more flow tokens than audio tokens
    assert level["vocoder_flow_tokens_per_audio_token"] > 1


def test_stream_level_has_a_timeline_of_its_passes_and_first_audio():
    level = _turbo_stream_level(3)
    timeline = level["timeline"]
    assert len(timeline["passes"]) == level["vocoder_passes"]
    assert all(0 < p["end_s"] <= level["wall_seconds"] for p in timeline["passes"])
    first = timeline["first_audio_s"]
    assert len(first) == 3 and first == sorted(first)
    # a stream's first audio comes out of a pass: after the first pass ended, which needed T3's tokens
    assert first[0] >= timeline["passes"][0]["end_s"] > timeline["t3_step_ends_s"][0]
    assert timeline["t3_step_ends_s"] == sorted(timeline["t3_step_ends_s"])
    steps = timeline["t3_step_seconds"]
    assert len(steps) == len(timeline["t3_step_ends_s"]) and all(s > 0 for s in steps)
    # a step ends no earlier than it lasted, counted from the level's start
    assert all(end >= s - 1e-3 for end, s in zip(timeline["t3_step_ends_s"], steps))


def test_a_stream_level_runs_on_a_frozen_heap_and_reports_the_collectors_pauses():
    level = _turbo_stream_level(2)
    report = level["gc"]
    assert report["frozen_objects"] > 0  # frozen as `chorus serve` freezes its warm heap
    assert gc.get_freeze_count() == 0  # and thawed when the level ended
    assert report["count"] >= 0 and report["total_s"] >= 0
    assert set(report["max_s_by_generation"]) <= {"0", "1", "2"}


def test_a_stream_level_consumes_its_streams_without_a_thread_each(monkeypatch):
    started: list[threading.Thread] = []
    original = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread)
        original(thread)

    @contextlib.contextmanager
    def watching_thread_starts():
        with monkeypatch.context() as patch:
            patch.setattr(threading.Thread, "start", start)
            yield

    level = _turbo_stream_level(6, watching_thread_starts)
    assert level["num_errors"] == 0 and len(level["timeline"]["first_audio_s"]) == 6
    assert started == []  # the streams were read on this thread's event loop, as the server reads them
