"""``VocoderConfig.hift_ops``: which kernels HiFT's Snake activations run in a stage; on a GPU,
a stage with the fused kernel against one with the plain ops, in graphed and eager passes."""
from __future__ import annotations

import pytest
import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.quality import snr_db
from tests.vocoder.models import random_s3gen
from tests.vocoder.conftest import graphed_and_eager_stream_audio

# bf16 streams with the fused Snake against the plain ops: the kernel rounds as they do, so only
# a sine differing in fp32's last bit moves a rounding, which random weights then amplify
MIN_STAGE_SNR_DB = 35.0


def test_hift_ops_must_name_a_backend():
    with pytest.raises(ValueError, match=r"hift_ops must be one of \('auto', 'triton', 'torch'\), got 'cuda'"):
        VocoderConfig(hift_ops="cuda")


def test_a_stage_sets_the_backend_of_its_hift():
    s3gen = random_s3gen("turbo", seed=4)
    VocoderStage(s3gen, VocoderConfig(hift_ops="torch"))
    assert s3gen.mel2wav.ops_backend == "torch"
    VocoderStage(s3gen)
    assert s3gen.mel2wav.ops_backend == "auto"


@pytest.mark.gpu
def test_a_stage_with_the_fused_snake_gives_the_plain_audio_graphed_and_eager():
    s3gen = random_s3gen("turbo", tiny=False, seed=3, dtype=torch.bfloat16, device="cuda")
    audio = {}
    for ops in ("torch", "auto"):
        stage = VocoderStage(s3gen, VocoderConfig(max_graph_rows=4, hift_ops=ops))
        stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=4)
        audio[ops] = graphed_and_eager_stream_audio(stage)
        assert stage.stats.graph_replays > 0 and stage.stats.eager_runs > 0
    assert audio["auto"].keys() == audio["torch"].keys() and len(audio["auto"]) == 9
    for job, expected in audio["torch"].items():
        assert audio["auto"][job].shape == expected.shape
        assert snr_db(expected, audio["auto"][job]) >= MIN_STAGE_SNR_DB
