"""The velocity estimator: time features, padding safety, parity with the reference."""
from __future__ import annotations

import pytest
import torch

from chorus.models.s3gen import ConditionalDecoder, FlowDecoder
from chorus.models.s3gen.estimator import timestep_features
from tests.models.s3gen.oracle_s3gen import TOLERANCE, build_oracle_flow, tiny_flow_config, torch_threads


@pytest.fixture(autouse=True)
def _single_thread():
    with torch_threads(1):
        yield


def _tiny_estimator(meanflow: bool) -> ConditionalDecoder:
    torch.manual_seed(0)
    estimator = ConditionalDecoder(tiny_flow_config().estimator, meanflow=meanflow).eval()
    with torch.no_grad():
        for p in estimator.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return estimator


def _inputs(batch: int, frames: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, mu, cond = torch.randn(3, batch, 80, frames, generator=g).unbind(0)
    spks = torch.randn(batch, 80, generator=g)
    return x, mu, spks, cond


@pytest.mark.oracle
def test_timestep_features_match_reference(oracle):
    from chatterbox.models.s3gen.matcha.decoder import SinusoidalPosEmb

    t = torch.tensor([0.0, 0.0123, 0.5, 0.98768, 1.0])
    assert torch.equal(timestep_features(t, 320), SinusoidalPosEmb(320)(t))


@pytest.mark.parametrize("meanflow", [False, True], ids=["standard", "meanflow"])
@torch.no_grad()
def test_padded_batch_matches_items_alone(meanflow):
    estimator = _tiny_estimator(meanflow)
    lengths = [13, 5, 9]
    x, mu, spks, cond = _inputs(len(lengths), max(lengths))
    t, r = torch.tensor([0.2, 0.5, 0.7]), torch.tensor([0.6, 0.9, 1.0])
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    v = estimator(x, mask, mu, t, spks, cond, r=r if meanflow else None)
    for i, n in enumerate(lengths):
        alone = estimator(x[i:i + 1, :, :n], mask[i:i + 1, :n], mu[i:i + 1, :, :n], t[i:i + 1],
                          spks[i:i + 1], cond[i:i + 1, :, :n], r=r[i:i + 1] if meanflow else None)
        torch.testing.assert_close(v[i, :, :n], alone[0], rtol=0, atol=1e-5)
        assert not v[i, :, n:].any(), "padded frames must come out as zeros"


@pytest.mark.oracle
@pytest.mark.parametrize("meanflow", [False, True], ids=["standard", "meanflow"])
@torch.no_grad()
def test_tiny_estimator_matches_reference_on_a_padded_batch(oracle, meanflow):
    config = tiny_flow_config(meanflow)
    reference_flow = build_oracle_flow(config)
    reference = reference_flow.decoder.estimator
    ours = FlowDecoder.from_state_dict(config, reference_flow.state_dict()).decoder.estimator
    lengths = torch.tensor([14, 9])
    x, mu, spks, cond = _inputs(2, 14, seed=1)
    mask = torch.arange(14)[None] < lengths[:, None]
    t, r = torch.tensor([0.3, 0.55]), torch.tensor([0.8, 1.0])
    expected = reference(x, mask[:, None].float(), mu, t, spks, cond, r=r if meanflow else None)
    actual = ours(x, mask, mu, t, spks, cond, r=r if meanflow else None)
    assert (actual - expected).abs().max() <= TOLERANCE
