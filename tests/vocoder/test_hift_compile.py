"""HiFT's decoder through torch.compile (``VocoderConfig.compile_hift``): the default and the
stage's wiring on the CPU; compiled against eager bf16 audio, and a whole compiled stage
against an eager one without compiles after warm-up, on a GPU (where the option is meant to
run: on a 2-core CPU one compile of even a tiny decoder took 70-150 s of the suite's time)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from chorus.models.s3gen.hift import SourceNoise
from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.pass_graphs import HiFTRunner
from chorus.vocoder.quality import snr_db
from tests.vocoder.conftest import graphed_and_eager_stream_audio
from tests.vocoder.models import random_s3gen

# compiled bf16 decode against fp32 eager may be this much worse than eager bf16 is (its fused
# kernels round in other places); on an H200, 32 x 500 frames, compiled vs eager bf16: 41.6 dB
SNR_MARGIN_DB = 1.0
# a whole compiled stage against an eager one, bf16 (the decoder's rounding only)
MIN_STAGE_SNR_DB = 35.0


def _compiles() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


@pytest.fixture(autouse=True)
def _fresh_compiles(monkeypatch, tmp_path):
    """Each test starts without compiled code (so its compile counts are its own and dynamo's
    recompile limit is not shared), and compiled kernels go to its temp dir, not the system's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _hift_inputs(rows: int, frames: int, seed: int, device: str, dtype: torch.dtype = torch.float32):
    """A pass's HiFT inputs: mel ``[rows, 80, frames]`` (zero past each count; every third row
    all ``frames``, the others 7 or 14 frames shorter), counts and source draws."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([frames - 7 * (i % 3) for i in range(rows)]).clamp(min=1)
    mel = (torch.randn(rows, 80, frames, generator=g) - 4) * (torch.arange(frames) < counts[:, None, None])
    phases = torch.rand(rows, 9, generator=g) * 6 - 3
    noise = torch.randn(rows, 9, frames * 480, generator=g)
    return mel.to(device=device, dtype=dtype), counts.to(device), SourceNoise(phases.to(device), noise.to(device))


# ------------------------------------------------------------------------------------ the CPU
def test_compile_hift_must_be_a_bool():
    with pytest.raises(ValueError, match=r"compile_hift must be True or False, got 'yes'"):
        VocoderConfig(compile_hift="yes")


def test_a_stage_runs_hift_eagerly_unless_its_config_compiles_it(tiny_turbo):
    assert not VocoderStage(tiny_turbo).graphs.hift_runner.compiled
    assert VocoderStage(tiny_turbo, VocoderConfig(compile_hift=True)).graphs.hift_runner.compiled


# ------------------------------------------------------------------------------------ a GPU
@pytest.mark.gpu
def test_the_compiled_bf16_decoder_is_as_close_to_fp32_as_the_eager_one():
    fp32 = random_s3gen("turbo", tiny=False, seed=3, device="cuda").mel2wav
    bf16 = random_s3gen("turbo", tiny=False, seed=3, dtype=torch.bfloat16, device="cuda").mel2wav
    reference, eager, compiled = HiFTRunner(fp32), HiFTRunner(bf16), HiFTRunner(bf16, compiled=True)
    with torch.inference_mode():
        for rows, frames in [(1, 120), (16, 500)]:
            mel, counts, source = _hift_inputs(rows, frames, seed=rows, device="cuda")
            saved = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = False  # an fp32 reference without TF32 convolutions
            try:
                want = reference(mel, counts, source)[0].cpu()
            finally:
                torch.backends.cudnn.allow_tf32 = saved
            mel = mel.to(torch.bfloat16)
            got, plain = compiled(mel, counts, source)[0].cpu(), eager(mel, counts, source)[0].cpu()
            valid = torch.arange(frames * 480) < 480 * counts.cpu()[:, None]
            assert snr_db(want[valid], got[valid]) >= snr_db(want[valid], plain[valid]) - SNR_MARGIN_DB
            assert not got[~valid].any()


@pytest.mark.gpu
def test_a_compiled_stage_gives_the_eager_audio_and_compiles_only_in_warmup():
    s3gen = random_s3gen("turbo", tiny=False, seed=3, dtype=torch.bfloat16, device="cuda")
    config = VocoderConfig(max_graph_rows=4)
    audio = {}
    for compiled in (True, False):
        stage = VocoderStage(s3gen, dataclasses.replace(config, compile_hift=compiled))
        before = _compiles()
        stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=4)
        warmed = _compiles()
        audio[compiled] = graphed_and_eager_stream_audio(stage)
        assert stage.stats.graph_replays > 0 and stage.stats.eager_runs > 0
        assert (warmed > before) == compiled  # batch 1 and batch >= 2
        assert _compiles() == warmed  # nothing compiled while serving: graphed, eager, any shape
    assert audio[True].keys() == audio[False].keys() and len(audio[True]) == 9
    for job, expected in audio[False].items():
        assert audio[True][job].shape == expected.shape
        assert snr_db(expected, audio[True][job]) >= MIN_STAGE_SNR_DB
