"""Strict loading of whole S3Gen files: the expected keys are the official ones, and any missing,
unexpected or mis-shaped key is reported before anything is built (checked with meta tensors)."""
from __future__ import annotations

import pytest
import torch

from chorus.models.checkpoint import CheckpointMismatchError
from chorus.models.random_checkpoint import reference_key_specs
from chorus.models.s3gen import FlowConfig
from chorus.models.s3gen.s3gen import S3Gen
from chorus.models.variants import get_variant


@pytest.mark.parametrize("table,meanflow,count", [("s3gen", False, 2490), ("s3genmf", True, 2491)])
def test_expected_keys_are_the_official_ones(table, meanflow, count):
    expected, optional = S3Gen.expected_keys(FlowConfig(meanflow=meanflow))
    official = {spec.name: spec.shape for spec in reference_key_specs(table)}
    assert expected == official and len(expected) == count
    assert {"tokenizer._mel_filters", "tokenizer.window"} <= optional


def _meta_state(meanflow: bool) -> dict[str, torch.Tensor]:
    expected, _ = S3Gen.expected_keys(FlowConfig(meanflow=meanflow))
    return {k: torch.empty(shape, device="meta") for k, shape in expected.items()}


def test_missing_and_unexpected_keys_are_named():
    state = _meta_state(False)
    del state["flow.encoder_proj.weight"]
    state["extra.thing"] = torch.empty(1, device="meta")
    with pytest.raises(CheckpointMismatchError) as info:
        S3Gen.from_state_dict(get_variant("original"), state, source="s3gen.safetensors")
    assert info.value.report.missing == ["flow.encoder_proj.weight"]
    assert info.value.report.unexpected == ["extra.thing"]


def test_the_wrong_flow_file_for_the_variant_is_explained():
    with pytest.raises(CheckpointMismatchError, match="s3gen_meanflow.safetensors"):
        S3Gen.from_state_dict(get_variant("turbo"), _meta_state(False), source="x")
    with pytest.raises(CheckpointMismatchError, match="s3gen.safetensors"):
        S3Gen.from_state_dict(get_variant("original"), _meta_state(True), source="x")


def test_legacy_weight_norm_names_and_absent_buffers_pass_the_key_check():
    state = _meta_state(True)
    for key in [k for k in state if k.startswith("mel2wav.") and k.endswith("parametrizations.weight.original0")]:
        state[key.replace("parametrizations.weight.original0", "weight_g")] = state.pop(key)
        direction = key.replace("original0", "original1")
        state[direction.replace("parametrizations.weight.original1", "weight_v")] = state.pop(direction)
    del state["tokenizer.window"], state["tokenizer._mel_filters"]
    state["flow.encoder_proj.bias"] = torch.empty(81, device="meta")  # the one real problem
    with pytest.raises(CheckpointMismatchError) as info:
        S3Gen.from_state_dict(get_variant("turbo"), state, source="x")
    report = info.value.report
    assert not report.missing and not report.unexpected
    assert [k for k, _, _ in report.wrong_shape] == ["flow.encoder_proj.bias"]
