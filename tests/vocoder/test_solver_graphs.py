"""CUDA graphs of the flow-matching solver: buckets, padding, the LRU cap, and graphed vs eager
solves and stage passes on a GPU."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from chorus.models.s3gen.flow_matching import _guide
from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.config import VocoderStats
from chorus.vocoder.quality import snr_db
from chorus.vocoder.solver_graphs import (GraphedSolver, SolverInputs, frame_bucket, row_bucket,
                                          solver_key)
from tests.vocoder.conftest import drain, joined
from tests.vocoder.models import random_s3gen, random_tokens, random_voice

# variant -> (steps, cfg rate) the solver tests use: the original's guided solve, turbo's meanflow
SOLVES = {"original": (10, 0.7), "turbo": (2, 0.0)}
# bf16 graphed vs eager on a GPU: a padded shape runs other kernels (other GEMM tilings), whose
# bf16 rounding then goes through every Euler step; relative error of the whole mel (norm).
BF16_GRAPH_TOLERANCE = 2e-2


def _inputs(batch: int, frames: int, seed: int, device="cpu", dtype=torch.float32):
    """Solver inputs with a different valid length per row (the longest is ``frames``)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([frames - 7 * i for i in range(batch)]).clamp(min=1)
    mask = torch.arange(frames)[None, :] < lengths[:, None]
    noise, mu, cond = (torch.randn(batch, 80, frames, generator=g) for _ in range(3))
    cond[:, :, frames // 3:] = 0  # the prompt region only, as the flow builds it
    spks = torch.randn(batch, 80, generator=g)
    move = dict(device=device, dtype=dtype)
    return noise.to(**move), mask.to(device), mu.to(**move), spks.to(**move), cond.to(**move)


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
        assert n <= bucket < n + max(64, n / 8) and frame_bucket(bucket) == bucket
    with pytest.raises(ValueError):
        frame_bucket(0)


def test_solver_key_leaves_the_cfg_weight_out():
    key = solver_key(3, 346, 10, 0.7, False, torch.bfloat16)
    assert (key.rows, key.frames, key.n_steps, key.guided, key.meanflow) == (4, 384, 10, True, False)
    assert solver_key(4, 384, 10, 0.3, False, torch.bfloat16) == key
    assert not solver_key(3, 346, 10, 0.0, False, torch.float32).guided
    assert not solver_key(3, 346, 2, 0.7, True, torch.float32).guided  # meanflow ignores cfg


def test_config_validates_the_graph_cap():
    with pytest.raises(ValueError, match="max_solver_graphs"):
        VocoderConfig(max_solver_graphs=0)
    assert VocoderConfig().cuda_graphs and VocoderConfig().max_solver_graphs >= 1


# -------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_on_the_cpu_the_wrapper_is_the_eager_solve(tiny_models, name):
    cfm = tiny_models[name].flow.decoder
    n_steps, cfg_rate = SOLVES[name]
    solver = GraphedSolver(cfm)
    assert not solver.active
    args = _inputs(3, 70, seed=1)
    got = solver(*args, n_steps=n_steps, cfg_rate=cfg_rate)
    assert torch.equal(got, cfm.solve(*args, n_steps=n_steps, cfg_rate=cfg_rate))
    assert (solver.stats.eager_solves, solver.stats.graph_replays, solver.stats.graph_captures) == (1, 0, 0)
    with pytest.raises(ValueError, match="n_steps"):
        solver(*args, n_steps=0, cfg_rate=cfg_rate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensor_guidance_weights_give_the_float_weights_values(tiny_original, dtype):
    # what a graph reads from memory must equal what solve computes with Python floats
    cfm = tiny_original.flow.decoder
    noise, mask, mu, spks, cond = _inputs(2, 40, seed=2)
    v_cond, v_uncond = (torch.randn(2, 80, 40, generator=torch.Generator().manual_seed(s)).to(dtype)
                        for s in (3, 4))
    weights = (torch.tensor(1.7), torch.tensor(0.7))
    assert torch.equal(_guide(v_cond, v_uncond, *weights), _guide(v_cond, v_uncond, 1.7, 0.7))
    got = cfm.integrate(noise, mask, mu, spks, cond, 3, guidance=weights)
    assert torch.equal(got, cfm.solve(noise, mask, mu, spks, cond, n_steps=3, cfg_rate=0.7))


@pytest.mark.parametrize("name", ["original", "turbo"])
@pytest.mark.parametrize("batch,frames", [(3, 70), (1, 64), (5, 200)])
def test_padded_buffers_give_the_unpadded_solve(tiny_models, name, batch, frames):
    # the graph's body run eagerly on the CPU: padding rows and frames changes no valid value
    cfm = tiny_models[name].flow.decoder
    n_steps, cfg_rate = SOLVES[name]
    args = _inputs(batch, frames, seed=batch + frames)
    key = solver_key(batch, frames, n_steps, cfg_rate, cfm.meanflow, torch.float32)
    inputs = SolverInputs(key, torch.device("cpu"))
    inputs.load(*args, cfg_rate=cfg_rate)
    assert not inputs.mask[batch:].any() and not inputs.mask[:, frames:].any()
    assert not inputs.noise[batch:].any() and not inputs.mu[:, :, frames:].any()
    padded = inputs.run(cfm)
    assert padded.shape == (key.rows, 80, key.frames)
    expected = cfm.solve(*args, n_steps=n_steps, cfg_rate=cfg_rate)
    torch.testing.assert_close(padded[:batch, :, :frames], expected, rtol=1e-5, atol=1e-5)


class _FakeGraphs(GraphedSolver):
    """Graph bookkeeping without a GPU: ``_capture`` records the keys it is asked for."""

    def __init__(self, cfm, fail=(), **kwargs):
        super().__init__(cfm, **kwargs)
        self.captured, self.fail = [], set(fail)

    @property
    def active(self) -> bool:
        return True

    def _capture(self, key):
        if key in self.fail:
            raise RuntimeError("capture failed")
        self.captured.append(key)
        return object()


def test_the_graph_cap_drops_the_least_recently_used(tiny_turbo):
    solver = _FakeGraphs(tiny_turbo.flow.decoder, max_graphs=2)
    a, b, c = (solver.key(1, f, 2, 0.0) for f in (64, 128, 192))
    assert solver.prepare(a) and solver.prepare(b) and not solver.prepare(a)
    assert solver._lookup(a) is not None  # a hit makes a the most recently used
    assert solver.prepare(c)
    assert solver.keys == [a, c] and solver.captured == [a, b, c]
    assert solver.prepare(b) and solver.keys == [c, b]
    assert solver.stats.graph_captures == 4


def test_a_shape_whose_capture_fails_is_solved_eagerly(tiny_turbo):
    cfm = tiny_turbo.flow.decoder
    args = _inputs(3, 70, seed=5)
    solver = _FakeGraphs(cfm, fail=[solver_key(3, 70, 2, 0.0, True, torch.float32)])
    for _ in range(2):  # the failed key is not tried again
        assert torch.equal(solver(*args, n_steps=2, cfg_rate=0.0), cfm.solve(*args, n_steps=2, cfg_rate=0.0))
    assert solver.stats.eager_solves == 2 and solver.stats.graph_captures == 0 and solver.captured == []


def test_a_cpu_stage_solves_eagerly_and_warmup_does_nothing(tiny_turbo):
    stage = VocoderStage(tiny_turbo)
    assert stage.warmup() == 0 and stage.stats.graph_captures == 0
    stage.add("j", random_voice(20, seed=1), seed=3, streaming=True)
    stage.push("j", random_tokens(50, seed=2), final=True)
    drain(stage)
    assert stage.stats.passes >= 2 and stage.stats.eager_solves == stage.stats.passes
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


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_graphed_solve_equals_eager_fp32_on_cuda(name):
    cfm = random_s3gen(name, seed=3, device="cuda").flow.decoder
    n_steps, cfg_rate = SOLVES[name]
    solver = GraphedSolver(cfm, stats=VocoderStats())
    with _exact_fp32(), torch.inference_mode():
        for batch, frames in [(3, 70), (1, 64), (4, 65), (5, 200), (3, 70)]:
            args = _inputs(batch, frames, seed=batch * frames, device="cuda")
            got = solver(*args, n_steps=n_steps, cfg_rate=cfg_rate)
            expected = cfm.solve(*args, n_steps=n_steps, cfg_rate=cfg_rate)
            assert got.shape == expected.shape == (batch, 80, frames) and got.dtype == expected.dtype
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # (3, 70) and (4, 65) share a bucket, and the repeated (3, 70) replays what it captured
    assert solver.stats.graph_captures == 3 and solver.stats.graph_replays == 5
    assert solver.stats.eager_solves == 0


@pytest.mark.gpu
def test_the_cfg_weight_changes_without_a_new_capture():
    cfm = random_s3gen("original", seed=3, device="cuda").flow.decoder
    solver = GraphedSolver(cfm)
    args = _inputs(3, 90, seed=7, device="cuda")
    with _exact_fp32(), torch.inference_mode():
        for cfg_rate in (0.7, 0.3, 1.5):
            torch.testing.assert_close(solver(*args, n_steps=4, cfg_rate=cfg_rate),
                                       cfm.solve(*args, n_steps=4, cfg_rate=cfg_rate), rtol=1e-4, atol=1e-4)
    assert solver.stats.graph_captures == 1 and solver.stats.graph_replays == 3


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_graphed_solve_is_close_to_eager_bf16_on_cuda(name):
    cfm = random_s3gen(name, seed=3, dtype=torch.bfloat16, device="cuda").flow.decoder
    n_steps, cfg_rate = SOLVES[name]
    solver = GraphedSolver(cfm)
    with torch.inference_mode():
        for batch, frames in [(3, 70), (5, 200), (2, 128)]:
            args = _inputs(batch, frames, seed=batch + frames, device="cuda", dtype=torch.bfloat16)
            got = solver(*args, n_steps=n_steps, cfg_rate=cfg_rate)
            expected = cfm.solve(*args, n_steps=n_steps, cfg_rate=cfg_rate)
            assert got.dtype == torch.bfloat16 and got.shape == expected.shape
            assert _rel_error(got, expected) <= BF16_GRAPH_TOLERANCE


@pytest.mark.gpu
def test_the_graph_cap_holds_on_cuda():
    cfm = random_s3gen("turbo", seed=3, device="cuda").flow.decoder
    solver = GraphedSolver(cfm, max_graphs=2)
    with torch.inference_mode():
        for frames in (64, 128, 192, 64):
            args = _inputs(2, frames, seed=frames, device="cuda")
            torch.testing.assert_close(solver(*args, n_steps=2, cfg_rate=0.0),
                                       cfm.solve(*args, n_steps=2, cfg_rate=0.0), rtol=1e-3, atol=1e-3)
    assert len(solver.keys) == 2 and solver.stats.graph_captures == 4


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
    assert graphed.stats.graph_replays == graphed.stats.passes > 0 and graphed.stats.eager_solves == 0
    assert eager.stats.eager_solves == eager.stats.passes and eager.stats.graph_captures == 0
    assert got.keys() == expected.keys() == {"s0", "s1", "s2"}
    for job in got:
        assert got[job].shape == expected[job].shape
        assert snr_db(expected[job], got[job]) >= 60.0


@pytest.mark.gpu
def test_warmup_captures_the_first_window_shapes():
    s3gen = random_s3gen("turbo", seed=3, device="cuda")
    stage = VocoderStage(s3gen, VocoderConfig(max_batch_items=4))
    captured = stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=2)
    # windows end at 20 and 60 tokens: frames 2 (30 + 23) = 106 and 2 (30 + 63) = 186 -> 128, 192
    assert captured == 4 == stage.stats.graph_captures
    assert {(k.rows, k.frames) for k in stage.solver.keys} == {(1, 128), (2, 128), (1, 192), (2, 192)}
    assert stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=2) == 0  # all held already
    stage.add("j", random_voice(30, seed=1), seed=3, streaming=True)
    stage.push("j", random_tokens(24, seed=2))
    assert [o.samples.shape[0] > 0 for o in stage.step()] == [True]
    assert stage.stats.graph_captures == 4 and stage.stats.graph_replays == 1  # no capture on first audio
    limited = VocoderStage(s3gen, VocoderConfig(max_solver_graphs=3))
    assert limited.warmup(prompt_tokens=30, chunk_tokens=60) == 3  # never past the cap


def test_a_shape_is_captured_only_on_its_nth_call(tiny_models):
    solver = GraphedSolver(tiny_models["turbo"].flow.decoder, capture_after=3)
    key = solver.key(2, 100, 2, 0.0)
    assert [solver.wants(key) for _ in range(4)] == [False, False, True, False]  # counting restarts


def test_capture_policy_settings_are_validated():
    with pytest.raises(ValueError, match="capture_after"):
        VocoderConfig(capture_after=0)
    with pytest.raises(ValueError, match="max_graph_rows"):
        VocoderConfig(max_graph_rows=0)
