"""Tiny random S3Gen models shared by the vocoder-stage tests (built once per session)."""
from __future__ import annotations

import pytest
import torch

from tests.models.s3gen.oracle_s3gen import torch_threads
from tests.vocoder.models import random_s3gen, random_tokens, random_voice


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_turbo():
    return random_s3gen("turbo", seed=3)


@pytest.fixture(scope="session")
def tiny_original():
    return random_s3gen("original", seed=3)


@pytest.fixture(scope="session")
def tiny_models(tiny_turbo, tiny_original):
    return {"turbo": tiny_turbo, "original": tiny_original}


def drain(stage) -> dict[str, list]:
    """Step until the stage has no work; every job's pieces in order."""
    pieces: dict[str, list] = {}
    while stage.has_work():
        for out in stage.step():
            pieces.setdefault(out.job_id, []).append(out)
    return pieces


def joined(pieces) -> torch.Tensor:
    return torch.cat([p.samples for p in pieces])


def record_flow_frames(stage) -> list[int]:
    """A list that gets the mel frames of every flow call ``stage`` makes from now on."""
    frames, run_flow = [], stage.graphs.run_flow

    def recording(call):
        frames.append(call.cond.shape[2])
        return run_flow(call)

    stage.graphs.run_flow = recording
    return frames


def one_job_audio(s3gen, voice, tokens, config, streaming):
    """One job's whole audio (all its tokens pushed at once, seed 5, 2 flow steps) on a fresh
    stage, and the stage's counters."""
    from chorus.vocoder import VocoderStage

    stage = VocoderStage(s3gen, config)
    stage.add("j", voice, seed=5, streaming=streaming, n_steps=2)
    stage.push("j", tokens, final=True)
    return joined(drain(stage)["j"]), stage.stats


def graphed_and_eager_stream_audio(stage) -> dict[str, torch.Tensor]:
    """Three streams of 60 tokens pushed 9 at a time (passes of 3 rows, graphed), then six of 80
    pushed at once (passes of 6 rows, more than the stage's ``max_graph_rows``: eager)."""
    voice, pieces = random_voice(30, seed=1), {}
    for i in range(3):
        stage.add(f"a{i}", voice, seed=i, streaming=True)
    for start in range(0, 60, 9):
        for i in range(3):
            stage.push(f"a{i}", random_tokens(60, seed=10 + i)[start:start + 9], final=start + 9 >= 60)
        for job, outs in drain(stage).items():
            pieces.setdefault(job, []).extend(outs)
    for i in range(6):
        stage.add(f"b{i}", voice, seed=10 + i, streaming=True)
        stage.push(f"b{i}", random_tokens(80, seed=20 + i), final=True)
    for job, outs in drain(stage).items():
        pieces.setdefault(job, []).extend(outs)
    assert all(outs[-1].final and outs[-1].error is None for outs in pieces.values())
    return {job: joined(outs) for job, outs in pieces.items()}


def assert_kernels_keep_bf16_as_close_to_fp32(option: str, margin_db: float) -> None:
    """Full-size turbo stages, streams in graphed and eager passes: in bf16 with
    ``VocoderConfig.<option>`` = ``"auto"`` (the Triton kernels) every stream's audio is as close
    to an fp32 stage's with the plain ops (TF32 off) as the bf16 stage with ``"torch"`` is, less
    ``margin_db`` (CUDA only).

    Anchored on fp32, not on the plain bf16 audio: a random-weight stage amplifies any moved bf16
    rounding (in the flow's ODE, then HiFT's source phase) to the distance bf16 itself has from
    fp32, so two equally good bf16 paths can be as far from each other as from fp32."""
    from chorus.vocoder import VocoderConfig, VocoderStage
    from chorus.vocoder.quality import snr_db

    audio = {}
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for dtype, runs in ((torch.float32, ("torch",)), (torch.bfloat16, ("torch", "auto"))):
            s3gen = random_s3gen("turbo", tiny=False, seed=3, dtype=dtype, device="cuda")
            for ops in runs:
                config = VocoderConfig(max_graph_rows=4, **{"hift_ops": "torch", "flow_ops": "torch", option: ops})
                stage = VocoderStage(s3gen, config)
                stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=4)
                audio[dtype, ops] = graphed_and_eager_stream_audio(stage)
                assert stage.stats.graph_replays > 0 and stage.stats.eager_runs > 0
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    reference = audio[torch.float32, "torch"]
    assert len(reference) == 9
    for job, want in reference.items():
        plain, fused = audio[torch.bfloat16, "torch"][job].float(), audio[torch.bfloat16, "auto"][job].float()
        assert fused.shape == plain.shape == want.shape, job
        assert snr_db(want, fused) >= snr_db(want, plain) - margin_db, job
