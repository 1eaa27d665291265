"""Loading HiFT checkpoints: official key names, both weight-norm spellings, strict checks, folding."""
from __future__ import annotations

import pytest
import torch

from chorus.models.checkpoint import CheckpointMismatchError
from chorus.models.s3gen.f0_predictor import F0PredictorConfig
from chorus.models.s3gen.hift import HiFTConfig, HiFTGenerator, draw_source_noise

TINY = HiFTConfig(base_channels=32, f0=F0PredictorConfig(hidden_channels=32))


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = HiFTGenerator(TINY)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("original0"):
                param.mul_(1 + 0.1 * torch.randn(param.shape))
        model.f0_predictor.classifier.weight.mul_(4000.0)
    return {k: v.clone() for k, v in model.state_dict().items()}


def legacy_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renames = {"parametrizations.weight.original0": "weight_g", "parametrizations.weight.original1": "weight_v"}
    out = {}
    for key, value in state.items():
        for modern, legacy in renames.items():
            key = key.replace(modern, legacy)
        out[key] = value
    return out


def test_hift_checkpoint_shapes_put_transposed_conv_gain_on_input_channels():
    shapes = HiFTGenerator.checkpoint_shapes()
    assert shapes["ups.0.parametrizations.weight.original0"] == (512, 1, 1)
    assert shapes["ups.0.parametrizations.weight.original1"] == (512, 256, 16)
    assert shapes["conv_pre.parametrizations.weight.original0"] == (512, 1, 1)
    assert not any(k.endswith((".weight_g", ".weight_v")) for k in shapes)


def test_hift_accepts_legacy_weight_norm_names(checkpoint):
    modern = HiFTGenerator.from_state_dict(checkpoint, config=TINY).state_dict()
    legacy = HiFTGenerator.from_state_dict(legacy_names(checkpoint), config=TINY).state_dict()
    assert modern.keys() == legacy.keys()
    assert all(torch.equal(modern[k], legacy[k]) for k in modern)


def test_hift_folded_weights_give_the_weight_norm_output(checkpoint):
    unfolded = HiFTGenerator(TINY)
    unfolded.load_state_dict(checkpoint)
    unfolded.eval()
    folded = HiFTGenerator.from_state_dict(checkpoint, config=TINY)
    assert not any("parametrizations" in k for k in folded.state_dict())
    mel = torch.randn(2, 80, 6)
    noise = draw_source_noise([6, 6], TINY)
    expected, actual = unfolded(mel, noise=noise), folded(mel, noise=noise)
    assert (actual.wav - expected.wav).abs().max().item() <= 1e-6


def test_hift_rejects_missing_and_unexpected_keys(checkpoint):
    broken = dict(checkpoint)
    del broken["conv_post.bias"]
    broken["conv_post.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointMismatchError) as info:
        HiFTGenerator.from_state_dict(broken, config=TINY)
    assert info.value.report.missing == ["conv_post.bias"]
    assert info.value.report.unexpected == ["conv_post.extra"]


def test_hift_rejects_wrong_shapes(checkpoint):
    with pytest.raises(CheckpointMismatchError) as info:
        HiFTGenerator.from_state_dict(checkpoint)  # full-size config, tiny tensors
    assert info.value.report.wrong_shape


def test_hift_loads_in_the_requested_dtype_and_returns_float32_audio(checkpoint):
    model = HiFTGenerator.from_state_dict(checkpoint, dtype=torch.bfloat16, config=TINY)
    assert {p.dtype for p in model.ups.parameters()} == {torch.bfloat16}
    pitch_path = [*model.f0_predictor.parameters(), *model.m_source.parameters()]
    assert {p.dtype for p in pitch_path} == {torch.float32}  # F0 sets phases: kept in float32
    out = model(torch.randn(1, 80, 4, dtype=torch.bfloat16), noise=draw_source_noise([4], TINY))
    assert out.wav.dtype == torch.float32 and torch.isfinite(out.wav).all()
