"""CUDA graphs of a vocoder pass (the flow and HiFT): buckets, padding, the LRU cap and the
capture policy on the CPU; graphed vs eager calls and stage passes on a GPU."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from chorus import capture_gate
from chorus.models.s3gen.flow_matching import _guide
from chorus.models.s3gen.hift import SourceNoise
from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.warmup import warmup_shapes
from chorus.vocoder.config import VocoderStats
from chorus.vocoder.pass_graphs import (FlowCall, FlowInputs, FlowKey, GraphLibrary, HiFTCall, HiFTInputs, PassGraphs,
                                        frame_bucket, row_bucket, vocode)
from chorus.vocoder.quality import snr_db
from tests.vocoder.conftest import drain, joined, record_flow_frames
from tests.vocoder.models import random_s3gen, random_tokens, random_voice

# variant -> (steps, cfg rate) the tests use: the original's guided solve, turbo's meanflow
SOLVES = {"original": (10, 0.7), "turbo": (2, 0.0)}
# bf16 graphed vs eager on a GPU: a padded shape runs other kernels (other GEMM tilings), whose
# bf16 rounding then goes through every Euler step; relative error of the whole mel (norm).
BF16_GRAPH_TOLERANCE = 2e-2


def _flow_call(s3gen, batch: int, width: int, seed: int, name: str, device="cpu") -> FlowCall:
    """Flow inputs with a different length per row (the longest is ``width`` tokens)."""
    g = torch.Generator().manual_seed(seed)
    flow = s3gen.flow
    ratio, dtype = flow.config.token_mel_ratio, flow.dtype
    lengths = torch.tensor([width - 5 * i for i in range(batch)]).clamp(min=1)
    tokens = torch.randint(0, flow.config.vocab_size, (batch, width), generator=g)
    tokens = tokens * (torch.arange(width)[None, :] < lengths[:, None])
    cond = torch.randn(batch, 80, ratio * width, generator=g)
    cond[:, :, ratio * width // 3:] = 0  # the prompt region only, as the flow builds it
    noise = torch.randn(batch, 80, ratio * width, generator=g)
    speaker = torch.randn(batch, 80, generator=g)
    n_steps, cfg_rate = SOLVES[name]
    move = dict(device=device, dtype=dtype)
    return FlowCall(tokens.to(device), lengths.to(device), cond.to(**move), noise.to(**move), speaker.to(**move),
                    n_steps, cfg_rate)


def _hift_call(s3gen, batch: int, frames: int, seed: int, device="cpu") -> HiFTCall:
    g = torch.Generator().manual_seed(seed)
    harmonics = s3gen.mel2wav.config.num_harmonics
    counts = torch.tensor([frames - 3 * i for i in range(batch)]).clamp(min=1)
    mel = torch.randn(batch, 80, frames, generator=g) - 4
    mel = mel * (torch.arange(frames)[None, None, :] < counts[:, None, None])
    phases = torch.rand(batch, harmonics, generator=g) * 6 - 3
    noise = torch.randn(batch, harmonics, frames * 480, generator=g)
    return HiFTCall(mel.to(device=device, dtype=s3gen.flow.dtype), counts.to(device),
                    SourceNoise(phases.to(device), noise.to(device)))


def _valid_frames(mel: torch.Tensor, call: FlowCall, ratio: int):
    return [mel[i, :, :ratio * int(n)] for i, n in enumerate(call.lengths.tolist())]


# ------------------------------------------------------------------------------------ buckets
def test_row_buckets_are_powers_of_two():
    assert [row_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 32, 64]
    with pytest.raises(ValueError):
        row_bucket(0)


def test_frame_buckets_are_multiples_of_64_then_8_per_doubling():
    assert [frame_bucket(n) for n in (1, 64, 65, 346, 1000, 1024)] == [64, 64, 128, 384, 1024, 1024]
    assert [frame_bucket(n) for n in (1025, 1153, 2048, 2049, 4097)] == [1152, 1280, 2048, 2304, 4608]
    assert len({frame_bucket(n) for n in range(1025, 2049)}) == 8
    for n in range(1, 9000, 7):
        bucket = frame_bucket(n)
        assert n <= bucket < n + max(64, n / 8) and frame_bucket(bucket) == bucket and bucket % 64 == 0
    with pytest.raises(ValueError):
        frame_bucket(0)


def test_the_flow_key_leaves_the_cfg_weight_out(tiny_models):
    graphs = PassGraphs(tiny_models["original"].flow, tiny_models["original"].mel2wav)
    key = graphs.flow_key(3, 346, 10, 0.7)
    assert (key.rows, key.frames, key.n_steps, key.guided, key.meanflow) == (4, 384, 10, True, False)
    assert graphs.flow_key(4, 384, 10, 0.3) == key
    assert not graphs.flow_key(3, 346, 10, 0.0).guided
    turbo = PassGraphs(tiny_models["turbo"].flow, tiny_models["turbo"].mel2wav)
    assert not turbo.flow_key(3, 346, 2, 0.7).guided  # meanflow ignores cfg


def test_config_validates_the_graph_settings():
    with pytest.raises(ValueError, match="max_pass_graphs"):
        VocoderConfig(max_pass_graphs=0)
    with pytest.raises(ValueError, match="capture_after"):
        VocoderConfig(capture_after=0)
    with pytest.raises(ValueError, match="max_graph_rows"):
        VocoderConfig(max_graph_rows=0)
    with pytest.raises(ValueError, match="covered_capture_after must be None"):
        VocoderConfig(covered_capture_after=0)
    assert VocoderConfig().cuda_graphs and VocoderConfig().max_pass_graphs >= 1


# -------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_on_the_cpu_calls_run_the_eager_functions(tiny_models, name):
    s3gen = tiny_models[name]
    graphs = PassGraphs(s3gen.flow, s3gen.mel2wav)
    assert not graphs.active
    call = _flow_call(s3gen, 3, 40, seed=1, name=name)
    hift_call = _hift_call(s3gen, 2, 30, seed=2)
    with torch.inference_mode():
        expected = s3gen.flow.generate_mel(call.tokens, call.lengths, call.cond, call.noise, call.speaker,
                                           call.n_steps, s3gen.flow.decoder.guidance(call.cfg_rate))
        expected_wav, expected_f0 = vocode(s3gen.mel2wav, hift_call.mel, hift_call.counts, hift_call.source)
    assert torch.equal(graphs.run_flow(call), expected)
    wav, f0 = graphs.run_hift(hift_call)
    assert torch.equal(wav, expected_wav) and torch.equal(f0, expected_f0)
    assert (graphs.stats.eager_runs, graphs.stats.graph_replays, graphs.stats.graph_captures) == (2, 0, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensor_guidance_weights_give_the_float_weights_values(tiny_original, dtype):
    # what a graph reads from memory must equal what solve computes with Python floats
    cfm = tiny_original.flow.decoder
    g = torch.Generator().manual_seed(2)
    noise, mu, cond = (torch.randn(2, 80, 40, generator=g) for _ in range(3))
    mask, spks = torch.ones(2, 40, dtype=torch.bool), torch.randn(2, 80, generator=g)
    v_cond, v_uncond = (torch.randn(2, 80, 40, generator=torch.Generator().manual_seed(s)).to(dtype)
                        for s in (3, 4))
    weights = (torch.tensor(1.7), torch.tensor(0.7))
    assert torch.equal(_guide(v_cond, v_uncond, *weights), _guide(v_cond, v_uncond, 1.7, 0.7))
    got = cfm.integrate(noise, mask, mu, spks, cond, 3, guidance=weights)
    assert torch.equal(got, cfm.solve(noise, mask, mu, spks, cond, n_steps=3, cfg_rate=0.7))


@pytest.mark.parametrize("name", ["original", "turbo"])
@pytest.mark.parametrize("batch,width", [(3, 35), (1, 32), (5, 70)])
@pytest.mark.parametrize("grow", [1, 2], ids=["own", "covering"])
def test_padded_flow_buffers_give_the_unpadded_call(tiny_models, name, batch, width, grow):
    # a graph's body run eagerly on the CPU: padding rows and frames changes no valid value, in
    # the call's own bucket or in a covering graph's of twice its rows and frames
    s3gen = tiny_models[name]
    graphs = PassGraphs(s3gen.flow, s3gen.mel2wav)
    ratio = s3gen.flow.config.token_mel_ratio
    call = _flow_call(s3gen, batch, width, seed=batch + width, name=name)
    key = graphs.flow_key(batch, ratio * width, call.n_steps, call.cfg_rate)
    key = dataclasses.replace(key, rows=grow * key.rows, frames=grow * key.frames)
    inputs = FlowInputs(key, ratio, torch.device("cpu"))
    inputs.load(call)
    assert inputs.lengths[batch:].eq(1).all() and not inputs.noise[batch:].any()
    assert not inputs.cond[:, :, ratio * width:].any() and not inputs.tokens[:, width:].any()
    with torch.inference_mode():
        padded = inputs.run(s3gen.flow)
    assert padded.shape == (key.rows, 80, key.frames)
    expected = graphs.run_flow(call)
    for got, want in zip(_valid_frames(padded, call, ratio), _valid_frames(expected, call, ratio)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,frames", [(3, 30), (1, 64), (2, 70)])
@pytest.mark.parametrize("grow", [1, 2], ids=["own", "covering"])
def test_padded_hift_buffers_give_the_unpadded_call(tiny_turbo, batch, frames, grow):
    graphs = PassGraphs(tiny_turbo.flow, tiny_turbo.mel2wav)
    call = _hift_call(tiny_turbo, batch, frames, seed=batch * frames)
    key = graphs.hift_key(batch, frames)
    key = dataclasses.replace(key, rows=grow * key.rows, frames=grow * key.frames)
    inputs = HiFTInputs(key, tiny_turbo.mel2wav.config.num_harmonics, 480, torch.device("cpu"))
    inputs.load(call)
    with torch.inference_mode():
        wav, f0 = inputs.run(graphs.hift_runner)
        expected_wav, expected_f0 = vocode(tiny_turbo.mel2wav, call.mel, call.counts, call.source)
    assert wav.shape == (key.rows, key.frames * 480) and f0.shape == (key.rows, key.frames)
    for i, count in enumerate(call.counts.tolist()):
        # a padded row changes the CPU's convolution kernels: up to 3e-5 on audio of RMS 0.04
        torch.testing.assert_close(wav[i, :480 * count], expected_wav[i, :480 * count], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(f0[i, :count], expected_f0[i, :count], rtol=1e-4, atol=1e-4)
        assert not wav[i, 480 * count:].any()


class _FakeLibrary(GraphLibrary):
    """Graph bookkeeping without a GPU: ``_capture`` records the keys it is asked for."""

    def __init__(self, fail=(), **kwargs):
        super().__init__("fake", None, lambda key: None, max_graphs=kwargs.get("max_graphs", 64),
                         capture_after=kwargs.get("capture_after", 1), stats=VocoderStats(), target=None,
                         cover_work=kwargs.get("cover_work"), covered_capture_after=kwargs.get("covered_capture_after"))
        self.captured, self.fail = [], set(fail)

    def _capture(self, key):
        if key in self.fail:
            raise RuntimeError("capture failed")
        self.captured.append(key)
        return object()


def test_the_graph_cap_drops_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    library = _FakeLibrary(max_graphs=2)
    a, b, c = "a", "b", "c"
    assert library.prepare(a) and library.prepare(b) and not library.prepare(a)
    assert library._lookup(a) is not None  # a hit makes a the most recently used
    assert library.prepare(c)
    assert library.keys == [a, c] and library.captured == [a, b, c]
    assert library.prepare(b) and library.keys == [c, b]
    assert library.stats.graph_captures == 4


def test_a_shape_whose_capture_fails_is_not_tried_again():
    library = _FakeLibrary(fail=["bad"])
    assert library.choose("bad") == "bad" and library.replay("bad", None) is None
    assert library.choose("bad") is None and not library.prepare("bad")
    assert library.stats.graph_captures == 0 and library.captured == []


def test_a_shape_is_captured_only_on_its_nth_use():
    library = _FakeLibrary(capture_after=3)
    assert [library.choose("k") for _ in range(4)] == [None, None, "k", None]  # counting restarts


def _fk(rows: int, frames: int, n_steps: int = 2, dtype=torch.bfloat16) -> FlowKey:
    return FlowKey(rows, frames, n_steps, guided=False, meanflow=True, dtype=dtype)


def _covering_library(capture_after: int = 3, cover_work: float | None = 4.0, fail=(),
                      covered_capture_after: int | None = None) -> _FakeLibrary:
    """Graphs held for (rows, frames) (4, 256), (8, 256), (4, 512) and (2, 128)."""
    library = _FakeLibrary(capture_after=capture_after, cover_work=cover_work, fail=fail,
                           covered_capture_after=covered_capture_after)
    for key in (_fk(4, 256), _fk(8, 256), _fk(4, 512), _fk(2, 128)):
        assert library.prepare(key)
    return library


def test_a_shape_without_a_graph_replays_the_held_one_of_least_padded_work_that_covers_it():
    library = _covering_library()
    # (2, 192): work 384; (4, 256) 1,024 (2.7x); (8, 256) and (4, 512) 2,048 (5.3x, past 4x);
    # (2, 128) has too few frames
    assert library.choose(_fk(2, 192)) == _fk(4, 256)
    assert library.choose(_fk(1, 64)) == _fk(2, 128)  # exactly 4x its work
    assert library.choose(_fk(4, 256)) == _fk(4, 256)  # a held shape replays its own


def test_no_graph_covers_past_the_work_bound_or_with_fewer_rows_or_frames():
    library = _covering_library()
    assert library.choose(_fk(1, 192)) is None  # work 192: (4, 256) would be 5.3x
    assert library.choose(_fk(16, 64)) is None  # no graph of 16 rows
    assert library.choose(_fk(1, 576)) is None  # none of 576 frames


def test_a_covering_graph_agrees_on_everything_but_rows_and_frames():
    library = _covering_library()
    assert library.choose(_fk(2, 192, n_steps=10)) is None
    assert library.choose(_fk(2, 192, dtype=torch.float32)) is None


def _use(library: _FakeLibrary, key: FlowKey, times: int) -> list:
    """``times`` calls of ``key``: what each replayed (capturing as a replay does)."""
    chosen = []
    for _ in range(times):
        chosen.append(library.choose(key))
        if chosen[-1] == key:
            assert library._lookup(key) is not None
    return chosen


def test_a_covered_shape_is_not_captured_in_a_pass_on_its_nth_use():
    library, key = _covering_library(capture_after=3), _fk(2, 192)
    assert _use(library, key, 5) == [_fk(4, 256)] * 5 and key not in library.captured


def test_a_covered_shape_used_n_times_is_captured_when_the_stage_is_idle():
    library, key = _covering_library(capture_after=3), _fk(2, 192)
    _use(library, key, 2)
    assert not library.capture_due()  # not due before its third use
    _use(library, key, 1)
    assert library.capture_due() and library.captured[-1] == key
    assert not library.capture_due()  # nothing else is due
    assert _use(library, key, 1) == [key]  # its own graph from now on


def test_the_most_used_due_shape_is_captured_first():
    library = _covering_library(capture_after=1)
    _use(library, _fk(2, 192), 2)
    _use(library, _fk(2, 200), 3)
    _use(library, _fk(3, 240), 1)
    assert library.capture_due() and library.capture_due() and library.capture_due()
    assert library.captured[-3:] == [_fk(2, 200), _fk(2, 192), _fk(3, 240)]


def test_a_covered_shape_is_captured_in_a_pass_on_its_covered_capture_after_th_use():
    library, key = _covering_library(capture_after=3, covered_capture_after=5), _fk(2, 192)
    assert _use(library, key, 6) == [_fk(4, 256)] * 4 + [key] * 2
    assert not library.capture_due()  # captured: no longer due


def test_a_shape_no_graph_covers_is_still_captured_in_a_pass_on_its_nth_use():
    library, key = _covering_library(capture_after=3), _fk(16, 64)  # no graph has 16 rows
    assert _use(library, key, 3) == [None, None, key] and not library.capture_due()


def test_a_shape_whose_capture_failed_replays_a_covering_graph():
    library, key = _covering_library(capture_after=1, fail=[_fk(2, 192)]), _fk(2, 192)
    assert library.choose(key) == _fk(4, 256)
    assert not library.capture_due()  # its capture failed
    assert _use(library, key, 3) == [_fk(4, 256)] * 3 and not library.capture_due()  # never tried again


def test_without_a_cover_bound_a_shape_without_a_graph_runs_eagerly():
    assert _covering_library(cover_work=None).choose(_fk(2, 192)) is None


@pytest.mark.parametrize("prompt_tokens", [95, 143])
def test_streams_over_a_voice_prompt_shorter_than_warmups_replay_planned_graphs(tiny_turbo, prompt_tokens):
    # warm-up plans for the variant's 10 s prompt (250 tokens); a stream over the shipped 3.8 s or
    # 5.7 s clip (95 or 143 tokens) reads flow frames below its smallest bucket, and every such
    # call has a planned graph that covers it within the default bound (docs/decisions.md, "Vocoder:
    # shapes without a graph replay a larger one")
    config = VocoderConfig()
    stage = VocoderStage(tiny_turbo, config)
    frames = record_flow_frames(stage)
    stage.add("s", random_voice(prompt_tokens, seed=1), seed=1, streaming=True)
    tokens = random_tokens(240, seed=2)
    for start in range(0, 240, 10):
        stage.push("s", tokens[start:start + 10], final=start + 10 >= 240)
        drain(stage)
    plan = warmup_shapes(config, ratio=2, prompt_tokens=250, chunk_tokens=240, whole_chunk_tokens=360,
                         most_rows=1, silence_tokens=tiny_turbo.variant.append_silence_tokens)
    library = _FakeLibrary(cover_work=config.graph_cover_work)
    for kind, (rows, planned_frames) in plan:
        if kind == "flow":
            library.prepare(_fk(rows, planned_frames))
    buckets = {frame_bucket(f) for f in frames}
    assert buckets - {key.frames for key in library.keys}  # the plan has no graph of their own
    assert [b for b in sorted(buckets) if library._cover(_fk(1, b)) is None] == [], sorted(buckets)


def test_a_stage_offers_a_due_capture_only_while_it_holds_no_job(tiny_turbo, monkeypatch):
    stage = VocoderStage(tiny_turbo)
    offered = []
    monkeypatch.setattr(stage.graphs, "capture_due", lambda: offered.append(True) or True)  # no GPU to capture on
    stage.add("j", random_voice(20, seed=1), seed=3, streaming=True)
    assert not stage.capture_while_idle() and offered == []  # a stream waits: no capture
    stage.push("j", random_tokens(30, seed=2), final=True)
    drain(stage)
    assert stage.capture_while_idle() and offered == [True]


def test_a_cpu_stage_never_captures_when_idle(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    assert not stage.capture_while_idle() and stage.stats.graph_captures == 0


def test_a_cpu_stage_runs_eagerly_and_warmup_does_nothing(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    assert stage.warmup() == 0 and stage.stats.graph_captures == 0
    stage.add("j", random_voice(20, seed=1), seed=3, streaming=True)
    stage.push("j", random_tokens(50, seed=2), final=True)
    drain(stage)
    assert stage.stats.passes >= 2 and stage.stats.eager_runs == 2 * stage.stats.passes
    assert stage.stats.graph_replays == 0


# -------------------------------------------------------------------------------------- GPU
@contextlib.contextmanager
def _exact_fp32():
    """fp32 without TF32, so graphed and eager fp32 differ only by kernels' summation order."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected.double()).norm() / expected.double().norm())


def _eager(s3gen) -> PassGraphs:
    return PassGraphs(s3gen.flow, s3gen.mel2wav, enabled=False)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_graphed_flow_equals_eager_fp32_on_cuda(name):
    s3gen = random_s3gen(name, seed=3, device="cuda")
    graphs, eager = PassGraphs(s3gen.flow, s3gen.mel2wav), _eager(s3gen)
    ratio = s3gen.flow.config.token_mel_ratio
    with _exact_fp32(), torch.inference_mode():
        for batch, width in [(3, 35), (1, 32), (4, 33), (5, 100), (3, 35)]:
            call = _flow_call(s3gen, batch, width, seed=batch * width, name=name, device="cuda")
            got, expected = graphs.run_flow(call), eager.run_flow(call)
            assert got.shape == expected.shape == (batch, 80, ratio * width) and got.dtype == expected.dtype
            for a, b in zip(_valid_frames(got, call, ratio), _valid_frames(expected, call, ratio)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # (3, 35) and (4, 33) share a bucket, and the repeated (3, 35) replays what it captured
    assert graphs.stats.graph_captures == 3 and graphs.stats.graph_replays == 5 and graphs.stats.eager_runs == 0


@pytest.mark.gpu
def test_graphed_hift_equals_eager_fp32_on_cuda():
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    graphs, eager = PassGraphs(s3gen.flow, s3gen.mel2wav), _eager(s3gen)
    with _exact_fp32(), torch.inference_mode():
        for batch, frames in [(3, 30), (1, 64), (4, 40), (2, 100)]:
            call = _hift_call(s3gen, batch, frames, seed=batch + frames, device="cuda")
            (wav, f0), (expected_wav, expected_f0) = graphs.run_hift(call), eager.run_hift(call)
            assert wav.shape == expected_wav.shape == (batch, 480 * frames)
            torch.testing.assert_close(wav, expected_wav, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(f0, expected_f0, rtol=1e-4, atol=1e-4)
    assert graphs.stats.graph_captures == 3 and graphs.stats.graph_replays == 4


def _six_captures_beside(step) -> PassGraphs:
    """Three flow and three HiFT shapes captured on this thread while another runs ``step()`` in a loop."""
    import threading

    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    graphs = PassGraphs(s3gen.flow, s3gen.mel2wav)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            step()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        with torch.inference_mode():
            for batch, width in [(3, 35), (1, 32), (5, 100)]:
                graphs.run_flow(_flow_call(s3gen, batch, width, seed=width, name="turbo", device="cuda"))
                graphs.run_hift(_hift_call(s3gen, batch, width, seed=width, device="cuda"))
    finally:
        stop.set()
        thread.join()
    return graphs


@pytest.mark.gpu
def test_shapes_are_captured_while_another_thread_synchronises_the_device():
    # T3's thread (or another model version's) synchronising through the gate cannot break a capture
    rounds = [0]

    def synchronise():
        capture_gate.synchronize()
        rounds[0] += 1

    graphs = _six_captures_beside(synchronise)
    assert rounds[0] > 0
    assert graphs.stats.graph_captures == 6 and graphs.stats.eager_runs == 0


@pytest.mark.gpu
def test_the_cfg_weight_changes_without_a_new_capture():
    s3gen = random_s3gen("original", seed=3, device="cuda")
    graphs, eager = PassGraphs(s3gen.flow, s3gen.mel2wav), _eager(s3gen)
    with _exact_fp32(), torch.inference_mode():
        for cfg_rate in (0.7, 0.3, 1.5):
            call = dataclasses.replace(_flow_call(s3gen, 3, 45, seed=7, name="original", device="cuda"),
                                       cfg_rate=cfg_rate, n_steps=4)
            torch.testing.assert_close(graphs.run_flow(call)[0], eager.run_flow(call)[0], rtol=1e-4, atol=1e-4)
    assert graphs.stats.graph_captures == 1 and graphs.stats.graph_replays == 3


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_graphed_calls_are_close_to_eager_bf16_on_cuda(name):
    s3gen = random_s3gen(name, seed=3, dtype=torch.bfloat16, device="cuda")
    graphs, eager = PassGraphs(s3gen.flow, s3gen.mel2wav), _eager(s3gen)
    ratio = s3gen.flow.config.token_mel_ratio
    with torch.inference_mode():
        for batch, width in [(3, 35), (5, 100), (2, 64)]:
            call = _flow_call(s3gen, batch, width, seed=batch + width, name=name, device="cuda")
            got, expected = graphs.run_flow(call), eager.run_flow(call)
            assert got.dtype == torch.bfloat16
            for a, b in zip(_valid_frames(got, call, ratio), _valid_frames(expected, call, ratio)):
                assert _rel_error(a, b) <= BF16_GRAPH_TOLERANCE
            hift_call = _hift_call(s3gen, batch, width, seed=batch, device="cuda")
            assert _rel_error(graphs.run_hift(hift_call)[0], eager.run_hift(hift_call)[0]) <= BF16_GRAPH_TOLERANCE


@pytest.mark.gpu
def test_the_graph_cap_holds_on_cuda():
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    graphs, eager = PassGraphs(s3gen.flow, s3gen.mel2wav, max_graphs=2), _eager(s3gen)
    with torch.inference_mode():
        for width in (32, 64, 96, 32):
            call = _flow_call(s3gen, 2, width, seed=width, name="turbo", device="cuda")
            torch.testing.assert_close(graphs.run_flow(call), eager.run_flow(call), rtol=1e-3, atol=1e-3)
    assert len(graphs.flow_graphs.keys) == 2 and graphs.stats.graph_captures == 4


def _stream_audio(s3gen, config: VocoderConfig, on_side_stream: bool):
    stage = VocoderStage(s3gen, config)
    voices = [random_voice(30, seed=1), random_voice(23, seed=2, odd_mel=True), random_voice(30, seed=3)]
    for i, voice in enumerate(voices):
        stage.add(f"s{i}", voice, seed=10 + i, streaming=i != 1, n_steps=SOLVES[s3gen.variant.name][0])
    side = torch.cuda.Stream() if on_side_stream else None
    pieces = {}
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for start in range(0, 90, 9):
            for i in range(3):
                stage.push(f"s{i}", random_tokens(90, seed=20 + i)[start:start + 9], final=start + 9 >= 90)
            for job, outs in drain(stage).items():
                pieces.setdefault(job, []).extend(outs)
    return stage, {job: joined(outs) for job, outs in pieces.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_a_stage_with_graphs_equals_one_without(name):
    # as the pipeline runs it: on a side stream, streaming and non-streaming jobs in one pass
    s3gen = random_s3gen(name, seed=3, device="cuda")
    config = VocoderConfig(max_batch_items=4, capture_after=1)  # every shape graphed from its first pass
    with _exact_fp32():
        graphed, got = _stream_audio(s3gen, config, on_side_stream=True)
        eager, expected = _stream_audio(s3gen, dataclasses.replace(config, cuda_graphs=False), on_side_stream=True)
    assert graphed.stats.graph_replays >= graphed.stats.passes > 0 and graphed.stats.eager_runs == 0
    assert eager.stats.eager_runs >= eager.stats.passes and eager.stats.graph_captures == 0
    assert got.keys() == expected.keys() == {"s0", "s1", "s2"}
    for job in got:
        assert got[job].shape == expected[job].shape
        assert snr_db(expected[job], got[job]) >= 60.0


@pytest.mark.gpu
def test_warmup_captures_the_first_window_shapes():
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=4))
    captured = stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=2)
    # windows end at 20 and 60 tokens: flow frames 2 (30 + 23) = 106 and 2 (30 + 63) = 186 -> 128, 192;
    # HiFT spans 2 (20 + 3) + 16 = 62 and 2 (40 + 3) + 16 = 102 -> 64, 128
    assert captured == 8 == stage.stats.graph_captures
    assert {(k.rows, k.frames) for k in stage.graphs.flow_graphs.keys} == {(1, 128), (2, 128), (1, 192), (2, 192)}
    assert {(k.rows, k.frames) for k in stage.graphs.hift_graphs.keys} == {(1, 64), (2, 64), (1, 128), (2, 128)}
    assert stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=2) == 0  # all held already
    stage.add("j", random_voice(30, seed=1), seed=3, streaming=True)
    stage.push("j", random_tokens(24, seed=2))
    assert [o.samples.shape[0] > 0 for o in stage.step()] == [True]
    assert stage.stats.graph_captures == 8 and stage.stats.graph_replays == 2  # no capture on first audio
    limited = VocoderStage(s3gen, VocoderConfig(max_pass_graphs=3))
    assert limited.warmup(prompt_tokens=30, chunk_tokens=60) == 6  # never past the cap of each kind


@pytest.mark.gpu
def test_after_warmup_a_stream_shorter_than_its_first_window_over_the_capped_prompt_replays():
    # its only pass reads 5 tokens + 3 silence over 10 prompt tokens: 2 (10 + 8) = 36 frames -> 64,
    # below the capped first window's 2 (10 + 23) = 66 -> 128 (a voice agent's short piece)
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=2, first_window_prompt_tokens=10))
    stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=1)
    captures, eager = stage.stats.graph_captures, stage.stats.eager_runs
    stage.add("short", random_voice(30, seed=1), seed=3, streaming=True)
    stage.push("short", random_tokens(5, seed=2), final=True)
    outputs = []
    while stage.has_work():
        outputs += stage.step()
    assert [o.job_id for o in outputs if o.samples.shape[0] > 0] == ["short"]
    assert stage.stats.graph_captures == captures and stage.stats.eager_runs == eager


@pytest.mark.gpu
def test_after_warmup_a_stream_over_a_shorter_voice_prompt_replays_a_covering_graph():
    # warm-up for 60-token prompts captures the flow's buckets 192 and 256 (2 (60 + 23) = 166 and
    # 2 (60 + 63) = 246); a 10-token prompt's first window is 2 (10 + 23) = 66 frames -> 128, which
    # none captured: it replays (1, 192) (1.5x its work) instead of running eagerly, and its audio
    # is the eager stage's
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    audio = {}
    with _exact_fp32():
        for graphed in (True, False):
            stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=2, cuda_graphs=graphed))
            stage.warmup(prompt_tokens=60, chunk_tokens=60, max_items=1)
            captures = stage.stats.graph_captures
            stage.add("short-voice", random_voice(10, seed=1), seed=3, streaming=True)
            stage.push("short-voice", random_tokens(24, seed=2))
            (out,) = stage.step()
            audio[graphed] = out.samples
            if graphed:
                assert {(k.rows, k.frames) for k in stage.graphs.flow_graphs.keys} == {(1, 192), (1, 256)}
                assert stage.stats.covered_replays == 1 and stage.stats.eager_runs == 0
                assert stage.stats.graph_captures == captures
    assert audio[True].shape == audio[False].shape and audio[True].shape[0] > 0
    assert snr_db(audio[False], audio[True]) >= 60.0


@pytest.mark.gpu
def test_a_covered_shape_gets_its_own_graph_when_the_stage_is_idle_not_in_a_pass():
    # as above: a 10-token prompt's first window (flow bucket 128) replays the (1, 192) graph; used
    # capture_after times it is due, and only an idle stage captures it
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=2))
    stage.warmup(prompt_tokens=60, chunk_tokens=60, max_items=1)
    planned = set(stage.graphs.flow_graphs.keys)
    for i in range(stage.config.capture_after):
        stage.add(f"short-voice-{i}", random_voice(10, seed=1), seed=3, streaming=True)
        stage.push(f"short-voice-{i}", random_tokens(24, seed=2), final=True)
        drain(stage)
    assert set(stage.graphs.flow_graphs.keys) == planned  # nothing captured in a pass
    captured = 0
    while stage.capture_while_idle():
        captured += 1
    new = {(k.rows, k.frames) for k in set(stage.graphs.flow_graphs.keys) - planned}
    assert captured >= 1 and (1, 128) in new


@pytest.mark.gpu
def test_warmup_captures_whole_chunks_so_a_batch_of_them_replays_at_once():
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=4))
    stage.warmup(prompt_tokens=30, chunk_tokens=60, whole_chunk_tokens=40)
    captured = stage.stats.graph_captures
    voice = random_voice(30, seed=1)
    for i, length in enumerate((40, 33, 25)):  # one pass of three whole chunks (row bucket 4)
        stage.add(f"w{i}", voice, seed=i, streaming=False)
        stage.push(f"w{i}", random_tokens(length, seed=10 + i), final=True)
    pieces = drain(stage)
    assert sorted(pieces) == ["w0", "w1", "w2"] and stage.stats.passes == 1
    assert stage.stats.graph_captures == captured and stage.stats.eager_runs == 0
    assert stage.stats.graph_replays == 2


@pytest.mark.gpu
def test_shapes_are_captured_while_another_thread_captures_graphs():
    # T3's sampler captures its graphs lazily in its own thread; torch.cuda.graph begins each capture
    # with a device-wide synchronisation, so two captures at once broke both (seen on a server)
    pool, stream, x, other_graphs = None, None, None, []

    def capture():
        nonlocal pool, stream, x
        if pool is None:
            pool, stream, x = torch.cuda.graph_pool_handle(), torch.cuda.Stream(), torch.zeros(1024, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with capture_gate.capture(graph, pool=pool, stream=stream):
            x.add_(1)
        other_graphs.append(graph)

    graphs = _six_captures_beside(capture)
    assert other_graphs  # the other thread was capturing meanwhile
    assert graphs.stats.graph_captures == 6 and graphs.stats.eager_runs == 0


@pytest.mark.gpu
def test_after_a_capture_breaks_mid_way_the_next_shape_is_still_captured():
    # a capture invalidated mid-way left its pool marked as recording: every later capture into it
    # failed, so one broken capture made every later shape run eagerly
    class Inputs:
        def __init__(self, key):
            self.key, self.x = key, torch.zeros(64, device="cuda")

        def load(self, call):
            pass

        def run(self, model):
            if self.key == "broken" and torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()  # not allowed while capturing: the capture is invalidated
            return self.x + 1

    library = GraphLibrary("test", None, Inputs, max_graphs=8, capture_after=1, stats=VocoderStats(),
                           target=capture_gate.CaptureTarget(torch.device("cuda")))
    assert library.replay("broken", None) is None
    output = library.replay("fine", None)
    assert output is not None and library.keys == ["fine"]
    torch.cuda.synchronize()
    assert output.eq(1).all()


@pytest.mark.gpu
def test_after_a_flow_capture_breaks_mid_way_the_hift_graph_is_still_captured(monkeypatch):
    # the two libraries capture into one pool: a new one after the break must serve both
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    graphs = PassGraphs(s3gen.flow, s3gen.mel2wav)
    inputs_of = graphs.flow_graphs.make_inputs

    class Breaking:
        def __init__(self, key):
            self.inner = inputs_of(key)

        def load(self, call):
            self.inner.load(call)

        def run(self, model):
            if torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()  # not allowed while capturing: the capture is invalidated
            return self.inner.run(model)

    monkeypatch.setattr(graphs.flow_graphs, "make_inputs", Breaking)
    with torch.inference_mode():
        graphs.run_flow(_flow_call(s3gen, 2, 40, seed=1, name="turbo", device="cuda"))  # runs eagerly
        graphs.run_hift(_hift_call(s3gen, 2, 40, seed=1, device="cuda"))
    assert graphs.flow_graphs.failures == 1 and graphs.hift_graphs.failures == 0
    assert graphs.stats.graph_captures == 1 and graphs.hift_graphs.keys


@pytest.mark.gpu
def test_warmup_says_how_many_shapes_it_could_not_capture(monkeypatch, caplog):
    # e.g. an 80 GB card whose KV pool left the vocoder too little memory for its largest shapes
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=4))
    library = stage.graphs.flow_graphs
    capture = library._capture

    def out_of_memory_at_two_rows(key):
        if key.rows == 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return capture(key)

    monkeypatch.setattr(library, "_capture", out_of_memory_at_two_rows)
    with caplog.at_level("WARNING", logger="chorus.vocoder.stage"):
        assert stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=2) == 6
    assert library.failures == 2
    assert "2 of 8 shapes could not be captured" in caplog.text and "gpu_memory_utilization" in caplog.text
