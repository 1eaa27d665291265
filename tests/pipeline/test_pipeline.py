"""The pipeline end to end on tiny models: equal to the exact path, streaming, ordering,
cancellation, deadlines and failures."""
from __future__ import annotations

import gc
import math
import threading
import time
import weakref

import numpy as np
import pytest

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.pipeline.config import PipelineConfig
from chorus.pipeline.pipeline import Pipeline
from chorus.pipeline.request import SpeechRequest
from chorus.pipeline.errors import PipelineError
from chorus.synthesis import Synthesizer
from chorus.vocoder import VocoderConfig
from chorus.vocoder.quality import one_pass_config
from tests.pipeline.tiny_pipeline import tiny_models

STREAM_SNR_DB = 10.0  # docs/vocoder.md: 12-16 dB at 150 tokens; these chunks are 60 tokens (3 windows)
TEXT = "The first sentence is here. A second one follows it. And a third closes the text."


def _pipeline(name: str, *, admit_ahead: bool = False, **config) -> Pipeline:
    """A tiny pipeline whose T3 steps do not follow measured time (``step_time_target_s``
    inf): tests here compare audio of separate runs bit for bit, and prompt chunks sized by
    time would change which vocoder passes the chunks share, and so the last bits."""
    models = tiny_models(name)
    engine = EngineConfig(variant=name, cache=CacheConfig(kv_cache_bytes=64 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=1024,
                                                    step_time_target_s=math.inf, admit_ahead=admit_ahead))
    return Pipeline(models, PipelineConfig(engine=engine, max_chars=40, **config)).start()


def _request(text=TEXT, tokens=30, seed=3, **kw) -> SpeechRequest:
    return SpeechRequest(text, seed=seed, max_new_tokens=tokens, min_new_tokens=tokens, normalize=False, **kw)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10((reference ** 2).sum() / max(((test - reference) ** 2).sum(), 1e-30)))


@pytest.fixture(scope="module", params=["original", "turbo"])
def pipe(request):
    pipeline = _pipeline(request.param)
    yield pipeline
    pipeline.close()


def _exact(pipe: Pipeline, request: SpeechRequest):
    return Synthesizer(pipe.models, max_chars=pipe.config.max_chars).run(pipe.plan(request))


def test_non_streaming_audio_equals_the_exact_path(pipe):
    request = _request()
    got, want = pipe.submit(request).result(), _exact(pipe, request)
    assert len(got.chunks) == 3
    assert [(c.text, c.seed, c.speech_tokens) for c in got.chunks] == \
        [(c.text, c.seed, c.speech_tokens) for c in want.chunks]
    assert got.wav.shape == want.wav.shape
    np.testing.assert_allclose(got.wav, want.wav, atol=1e-4)


def test_requests_admitted_while_another_streams_equal_the_exact_path_with_admissions_ahead():
    pipe = _pipeline("turbo", admit_ahead=True)
    try:
        first = pipe.submit(_request(tokens=60, stream=True))
        next(iter(first))  # its audio has begun: T3 is decoding it
        later = [_request(seed=seed) for seed in (5, 6)]
        streams = [pipe.submit(r) for r in later]
        for request, stream in zip(later, streams):
            got, want = stream.result(), _exact(pipe, request)
            assert [(c.text, c.seed, c.speech_tokens) for c in got.chunks] == \
                [(c.text, c.seed, c.speech_tokens) for c in want.chunks]
            np.testing.assert_allclose(got.wav, want.wav, atol=1e-4)
        first.result()
        assert pipe.engine.num_steps_ahead > 0
    finally:
        pipe.close()


def test_streamed_audio_comes_in_pieces_in_chunk_order_and_matches_one_pass(pipe):
    stream = pipe.submit(_request(tokens=60, stream=True))
    pieces = list(stream)
    result = stream.result()
    indexes = [p.chunk_index for p in pieces]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1, 2}
    assert len(pieces) > 3  # chunks arrive in several windows
    assert pieces[-1].final and not any(p.final for p in pieces[:-1])
    streamed = np.concatenate([p.samples for p in pieces])
    np.testing.assert_array_equal(streamed, result.wav)
    # the same streams vocoded in one pass each (same noise tapes): docs/vocoder.md's bound
    reference = _pipeline(pipe.models.variant.name, vocoder=one_pass_config(VocoderConfig()))
    try:
        one_pass = reference.submit(_request(tokens=60, stream=True)).result().wav
    finally:
        reference.close()
    assert streamed.shape == one_pass.shape
    assert snr_db(one_pass, streamed) >= STREAM_SNR_DB


def test_a_streams_timings_say_when_each_step_to_its_first_audio_happened(pipe):
    timings = pipe.submit(_request(tokens=30, stream=True)).result().timings
    assert 0 < timings["first_token_s"] <= timings["first_window_s"] <= timings["first_pass_s"] \
        <= timings["first_audio_s"] <= timings["total_s"]
    assert "first_window_s" not in pipe.submit(_request(tokens=12)).result().timings  # no windows unstreamed


def test_a_stream_shorter_than_its_first_window_is_stamped_at_its_last_token(pipe):
    timings = pipe.submit(_request(tokens=8, stream=True)).result().timings  # 8 < 20 + 3 tokens
    assert timings["first_token_s"] <= timings["first_window_s"] <= timings["first_pass_s"]


PAUSED = 'The first part is here. <break time="500ms"/> The second part follows.'


def test_a_break_is_exact_silence_between_the_audio_of_its_two_sides(pipe):
    got = pipe.submit(_request(PAUSED)).result()
    joined = pipe.submit(_request("The first part is here.\n\nThe second part follows.")).result()
    first = got.chunks[0].num_samples
    assert got.pauses == ((first, 12_000),) and not got.wav[first:first + 12_000].any()
    np.testing.assert_allclose(np.delete(got.wav, np.s_[first:first + 12_000]), joined.wav, atol=1e-4)


def test_the_exact_path_puts_a_break_where_the_pipeline_does(pipe):
    request = _request(PAUSED)
    got, want = pipe.submit(request).result(), _exact(pipe, request)
    assert got.pauses == want.pauses
    np.testing.assert_allclose(got.wav, want.wav, atol=1e-4)


def test_a_streamed_break_is_one_piece_of_exact_silence_in_its_place(pipe):
    stream = pipe.submit(_request(PAUSED, stream=True))
    pieces = list(stream)
    result = stream.result()
    pauses = [i for i, p in enumerate(pieces) if p.pause]
    assert len(pauses) == 1 and not pieces[pauses[0]].samples.any() and pieces[pauses[0]].samples.size == 12_000
    start = sum(p.samples.size for p in pieces[:pauses[0]])
    assert result.pauses == ((start, 12_000),) and start == result.chunks[0].num_samples
    np.testing.assert_array_equal(np.concatenate([p.samples for p in pieces]), result.wav)


def test_a_streamed_break_at_the_end_is_the_final_piece(pipe):
    pieces = list(pipe.submit(_request('The only part.<break time="1s"/>', stream=True)))
    assert pieces[-1].pause and pieces[-1].final and pieces[-1].samples.size == 24_000
    assert not any(p.final for p in pieces[:-1])


def test_a_break_at_the_start_is_the_first_streamed_piece(pipe):
    pieces = list(pipe.submit(_request('<break time="200ms"/>The only part.', stream=True)))
    assert pieces[0].pause and pieces[0].samples.size == 4_800 and not pieces[0].samples.any()


def test_many_requests_at_once_each_get_their_own_audio(pipe):
    requests = [_request(f"Request number {i} speaks.", tokens=12 + i, seed=100 + i) for i in range(5)]
    progress = []
    results = pipe.generate(requests, progress=progress.append)
    assert len(progress) == 5
    for request, result in zip(requests, results):
        alone = _exact(pipe, request)
        np.testing.assert_allclose(result.wav, alone.wav, atol=1e-4)


def test_cancel_mid_stream_frees_every_block_and_leaves_others_untouched(pipe):
    other = pipe.submit(_request("Another text runs beside it.", tokens=40))
    victim = pipe.submit(_request(tokens=400, stream=True))
    iterator = iter(victim)
    next(iterator)
    victim.cancel()
    with pytest.raises(PipelineError, match="aborted"):
        list(iterator)
    result = other.result()
    np.testing.assert_allclose(result.wav, _exact(pipe, _request("Another text runs beside it.", tokens=40)).wav,
                               atol=1e-4)
    _wait_idle(pipe)


def test_a_deadline_fails_the_request_and_frees_its_work(pipe):
    stream = pipe.submit(_request(tokens=900, deadline_s=0.3))
    with pytest.raises(PipelineError) as info:
        stream.result(timeout=60)
    assert info.value.reason == "deadline"
    _wait_idle(pipe)


class _Gate:
    """Holds every T3 step while closed (``with _Gate(pipe) as gate``); the vocoder thread runs on."""

    def __init__(self, pipe: Pipeline):
        self.engine, self.open = pipe.engine, threading.Event()
        self.open.set()
        self._step = self.engine.step

    def _step_when_open(self):
        assert self.open.wait(60), "the gate was never opened"
        return self._step()

    def __enter__(self) -> "_Gate":
        self.engine.step = self._step_when_open
        return self

    def __exit__(self, *exc) -> None:
        self.engine.step = self._step
        self.open.set()


def test_a_start_deadline_fails_a_request_with_no_audio_yet(pipe):
    with _Gate(pipe) as gate:
        gate.open.clear()  # no T3 token, so no audio, until the request has failed
        stream = pipe.submit(_request(tokens=100, stream=True, start_deadline_s=0.05))
        with pytest.raises(PipelineError) as info:
            stream.result(timeout=60)
    assert info.value.reason == "deadline"
    assert info.value.message == "no audio within its start deadline (0.05 s)"
    _wait_idle(pipe)


def test_a_start_deadline_does_not_cut_a_stream_whose_audio_flows(pipe):
    start_s = 3.0
    with _Gate(pipe) as gate:
        submitted = time.monotonic()
        stream = pipe.submit(_request(tokens=200, stream=True, start_deadline_s=start_s))
        pieces = iter(stream)
        next(pieces)  # audio flows (well before the start deadline on tiny models)
        gate.open.clear()
        while time.monotonic() <= submitted + start_s:  # the start deadline passes mid-stream
            time.sleep(0.05)
        gate.open.set()
        rest = list(pieces)  # every later piece passes the vocoder thread's deadline check
    assert rest and rest[-1].final
    assert stream.result().chunks[0].speech_tokens == 200


def test_a_total_deadline_cuts_a_flowing_stream(pipe):
    with _Gate(pipe) as gate:
        # room for the first piece even on a loaded machine (a deadline before it is another case)
        stream = pipe.submit(_request(tokens=400, stream=True, deadline_s=5.0))
        pieces = iter(stream)
        next(pieces)
        gate.open.clear()  # the rest cannot come before the total deadline
        with pytest.raises(PipelineError) as info:
            list(pieces)
    assert info.value.reason == "deadline"
    assert info.value.message == "not finished within its total deadline (5 s)"
    _wait_idle(pipe)


def test_a_failed_t3_chunk_fails_its_request_only(pipe, monkeypatch):
    bad = _request(tokens=10, request_id="bad-one")
    good = _request("A good request.", tokens=10)
    original = pipe.engine.runner.add_request

    def fail_for_bad(request_id, *args, **kwargs):
        if request_id.startswith("bad-one#1"):
            raise ValueError("injected admission failure")
        return original(request_id, *args, **kwargs)

    monkeypatch.setattr(pipe.engine.runner, "add_request", fail_for_bad)
    bad_stream, good_stream = pipe.submit(bad), pipe.submit(good)
    with pytest.raises(PipelineError, match="injected admission failure"):
        bad_stream.result(timeout=60)
    assert good_stream.result(timeout=60).duration > 0
    _wait_idle(pipe)


def test_bad_input_raises_at_submit_and_queues_nothing(pipe):
    with pytest.raises(ValueError, match="top_p"):
        pipe.submit(_request(top_p=2.0))
    assert not pipe.engine.has_unfinished_requests()


def test_closing_fails_running_requests():
    pipeline = _pipeline("turbo")
    stream = pipeline.submit(_request(tokens=900))
    pipeline.close()
    with pytest.raises(PipelineError) as info:
        stream.result(timeout=30)
    assert info.value.reason in ("stopped", "aborted")


def _wait_idle(pipe: Pipeline, timeout: float = 30.0) -> None:
    """Cancels and failures are applied by the worker threads; wait until both are idle."""
    done = threading.Event()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (not pipe.engine.has_unfinished_requests() and not pipe.vocoder.has_work()
                and pipe.engine.kv_manager.num_free_blocks == pipe.engine.kv_cache.num_blocks):
            done.set()
            break
        time.sleep(0.02)
    assert done.is_set(), "the pipeline did not free everything"


def test_an_ended_request_is_freed_without_the_cyclic_collector(pipe, monkeypatch):
    """A running request and its jobs point at each other; once it has finished or failed,
    reference counting alone frees it (the cyclic collector's full collections stop every
    thread of a server)."""
    states = []
    register = pipe._register

    def register_and_watch(*args, **kwargs):
        state = register(*args, **kwargs)
        states.append(weakref.ref(state))
        return state

    monkeypatch.setattr(pipe, "_register", register_and_watch)
    gc.collect()
    gc.disable()
    try:
        pipe.submit(_request(tokens=20)).result(timeout=60)
        failed = pipe.submit(_request(tokens=900, deadline_s=0.3))
        with pytest.raises(PipelineError):
            failed.result(timeout=60)
        # the vocoder thread ends requests one at a time: once a third has finished, it has
        # left the other two's last frames
        pipe.submit(_request("One more.", tokens=10)).result(timeout=60)
        assert [state() for state in states[:2]] == [None, None]
    finally:
        gc.enable()


def test_a_request_id_cannot_run_twice_at_once(pipe):
    first = pipe.submit(_request(tokens=200, request_id="same-id"))
    with pytest.raises(ValueError, match="already running"):
        pipe.submit(_request(tokens=10, request_id="same-id"))
    first.result(timeout=120)
    pipe.submit(_request(tokens=10, request_id="same-id")).result(timeout=60)  # free again once ended


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_a_dead_t3_thread_fails_its_requests_instead_of_hanging(monkeypatch):
    pipeline = _pipeline("turbo")
    try:
        def broken_step():
            raise RuntimeError("scheduler bug")

        monkeypatch.setattr(pipeline.engine, "step", broken_step)
        stream = pipeline.submit(_request(tokens=20))
        with pytest.raises(PipelineError, match="engine stopped: scheduler bug") as info:
            stream.result(timeout=30)
        assert info.value.reason == "error"
    finally:
        pipeline.close()


def test_async_iteration_gives_the_same_pieces_without_a_thread_per_stream(pipe):
    import asyncio

    request = _request(stream=True, request_id="async-1")
    want = [p.samples for p in pipe.submit(request)]

    async def consume():
        threads = threading.active_count()
        stream = pipe.submit(_request(stream=True, request_id="async-2"))
        pieces = [p.samples async for p in stream]
        return pieces, threading.active_count() - threads, stream.finished

    got, extra_threads, finished = asyncio.run(consume())
    assert finished and extra_threads == 0
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_engine_stats_are_served_by_the_engine_thread(pipe):
    stats = pipe.engine_stats()
    assert stats.kv.num_used_blocks == 0 and stats.num_waiting == 0
    assert pipe.stall(timeout_s=5.0) is None


@pytest.mark.parametrize("warmup", [True, False])
def test_with_warmup_the_vocoder_captures_before_the_engine_sizes_its_kv_pool(monkeypatch, warmup):
    # on CUDA the engine's pool is a fraction of the device less what is held: graphs captured
    # first keep their memory, graphs captured after must fit in what the pool leaves
    import chorus.pipeline.pipeline as pipeline_module
    from chorus.vocoder import VocoderStage

    order: list[str] = []
    stage_warmup, engine = VocoderStage.warmup, pipeline_module.T3Engine

    def recording_warmup(stage, **kwargs):
        order.append("vocoder warm-up")
        return stage_warmup(stage, **kwargs)

    def recording_engine(*args, **kwargs):
        order.append("T3 engine sized")
        return engine(*args, **kwargs)

    monkeypatch.setattr(VocoderStage, "warmup", recording_warmup)
    monkeypatch.setattr(pipeline_module, "T3Engine", recording_engine)
    Pipeline(tiny_models("turbo"), PipelineConfig(warmup=warmup)).close()
    assert order == (["vocoder warm-up", "T3 engine sized"] if warmup else ["T3 engine sized"])
