"""``VocoderConfig.hift_ops``: which kernels HiFT's Snake activations run in a stage; on a GPU,
a stage with the fused kernel against one with the plain ops, in graphed and eager passes."""
from __future__ import annotations

import pytest

from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.conftest import assert_kernels_keep_the_plain_audio
from tests.vocoder.models import random_s3gen

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
    assert_kernels_keep_the_plain_audio("hift_ops", MIN_STAGE_SNR_DB)
