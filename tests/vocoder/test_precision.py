"""The stage in the model's dtype on a GPU, and one full-size stream on the CPU."""
from __future__ import annotations

import pytest
import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.quality import boundary_jumps, one_pass_config, snr_db
from tests.vocoder.conftest import drain, joined
from tests.vocoder.models import random_s3gen, random_tokens, random_voice

# bf16 against fp32 on tiny random models, measured with bf16 on the CPU (docs/vocoder.md):
# 15.1-15.8 dB for one pass and for streams; GPU kernels round differently, hence the margin.
MIN_BF16_SNR_DB = 8.0
# full-size random turbo, 2 meanflow steps, 100 tokens in pushes of 7: 16.3 dB, jump ratio 0.93
MIN_FULLSIZE_SNR_DB = 12.0


def _stage_audio(s3gen, tokens, voice, streaming, config=VocoderConfig()):
    stage = VocoderStage(s3gen, config)
    stage.add("j", voice, seed=11, streaming=streaming, n_steps=2)
    pieces = []
    for i in range(0, len(tokens), 9):
        stage.push("j", tokens[i:i + 9], final=i + 9 >= len(tokens))
        pieces += drain(stage).get("j", [])
    assert pieces and pieces[-1].final and pieces[-1].error is None
    return pieces


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["turbo", "original"])
def test_bf16_gpu_stream_is_close_to_fp32_cpu_one_pass(name):
    # a stream draws its noise on the CPU, so GPU and CPU streams share it
    cpu = random_s3gen(name, seed=3)
    gpu = random_s3gen(name, seed=3, dtype=torch.bfloat16, device="cuda")
    assert gpu.dtype == torch.bfloat16
    voice, tokens = random_voice(40, seed=4), random_tokens(80, seed=5)
    expected = joined(_stage_audio(cpu, tokens, voice, True, one_pass_config(VocoderConfig())))
    got = joined(_stage_audio(gpu, tokens, voice, True))
    assert got.device.type == "cpu" and got.dtype == torch.float32 and got.shape == expected.shape
    assert snr_db(expected, got) >= MIN_BF16_SNR_DB


@pytest.mark.gpu
def test_bf16_gpu_non_streaming_equals_tokens_to_wav_on_the_gpu():
    gpu = random_s3gen("turbo", seed=3, dtype=torch.bfloat16, device="cuda")
    voice, tokens = random_voice(40, seed=4), random_tokens(80, seed=5)
    [got] = _stage_audio(gpu, tokens, voice, streaming=False)
    [expected] = gpu.tokens_to_wav([tokens], voice, seeds=[11], n_steps=2)
    assert got.samples.shape == expected.shape
    assert snr_db(expected, got.samples) >= 40.0  # same noise, same dtype: only batch padding differs


@pytest.mark.fullsize
def test_fullsize_turbo_stream_is_close_to_one_pass():
    s3gen = random_s3gen("turbo", tiny=False, seed=3)
    voice, tokens = random_voice(50, seed=4), random_tokens(100, seed=5)
    pieces = _stage_audio(s3gen, tokens, voice, streaming=True)
    reference = joined(_stage_audio(s3gen, tokens, voice, True, one_pass_config(VocoderConfig())))
    streamed = joined(pieces)
    assert len(pieces) >= 3 and streamed.shape == reference.shape
    assert snr_db(reference, streamed) >= MIN_FULLSIZE_SNR_DB
    starts = torch.tensor([p.samples.shape[0] for p in pieces]).cumsum(0)[:-1].tolist()
    assert boundary_jumps(streamed, starts, reach=VocoderConfig().crossfade_frames * 480 + 1).ratio <= 1.5
