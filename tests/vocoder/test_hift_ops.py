"""``VocoderConfig.hift_ops``: which kernels HiFT's Snake activations run in a stage; on a GPU,
a stage with the fused kernel against one with the plain ops, in graphed and eager passes."""
from __future__ import annotations

import pytest

from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.conftest import assert_kernels_keep_bf16_as_close_to_fp32
from tests.vocoder.models import random_s3gen

# a bf16 stage's streams with the fused Snake against an fp32 stage's: as close as the plain ops'
# bf16 streams, less this. The kernel rounds as they do, so only a sine differing in fp32's last
# bit moves a rounding, which random weights then amplify (tests/vocoder/conftest.py says why the
# anchor is fp32)
STAGE_MARGIN_DB = 1.0


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
def test_a_bf16_stage_with_the_fused_snake_is_as_close_to_fp32_graphed_and_eager():
    assert_kernels_keep_bf16_as_close_to_fp32("hift_ops", STAGE_MARGIN_DB)
