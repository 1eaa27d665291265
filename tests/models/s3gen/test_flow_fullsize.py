"""Full-size parity of the flow with the reference S3Gen, loaded from the official file layout.

The reference is built with seeded random weights (norms, zero biases and the meanflow time mixer
perturbed), saved as ``s3gen.safetensors`` / ``s3gen_meanflow.safetensors``; only the ``flow.*``
part is loaded into Chorus. Inputs are short: a 50-token / 100-frame prompt and 20 new tokens.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from chorus.models.s3gen import FlowConfig, FlowDecoder
from tests.models.s3gen.oracle_s3gen import (
    TOLERANCE,
    build_oracle_s3gen,
    load_official,
    oracle_ref_dict,
    recorded_randn,
    save_official,
)

pytestmark = [pytest.mark.oracle, pytest.mark.fullsize]

PROMPT_TOKENS, NEW_TOKENS = 50, 20


@dataclass
class Pair:
    reference: torch.nn.Module  # S3Token2Wav
    ours: FlowDecoder
    meanflow: bool


@pytest.fixture(scope="module", params=[False, True], ids=["standard", "meanflow"])
def pair(request, oracle, module_tmp_path_factory):
    meanflow = request.param
    reference = build_oracle_s3gen(meanflow=meanflow, seed=1 + meanflow)
    path = save_official(reference, str(module_tmp_path_factory.mktemp("s3gen")), meanflow)
    ours = FlowDecoder.from_state_dict(FlowConfig(meanflow=meanflow), load_official(path),
                                       prefix="flow.", source=path)
    os.remove(path)
    yield Pair(reference, ours, meanflow)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 6561, (1, PROMPT_TOKENS), generator=g)
    tokens = torch.randint(0, 6561, (1, NEW_TOKENS), generator=g)
    prompt_mel = torch.randn(1, 2 * PROMPT_TOKENS, 80, generator=g) * 2 - 6  # log-mel-like values
    xvector = torch.randn(1, 192, generator=g)
    return prompt, tokens, prompt_mel, xvector


def _report(record_property, name: str, error: float) -> None:
    record_property(name, error)
    print(f"\n{name}: max abs error {error:.3g}")


@torch.inference_mode()
def test_encoder_output_matches_reference(pair, record_property):
    prompt, tokens, _, _ = _inputs()
    all_tokens = torch.cat([prompt, tokens], dim=1)
    lengths = torch.tensor([all_tokens.shape[1]])
    ref_flow = pair.reference.flow
    expected, _ = ref_flow.encoder(ref_flow.input_embedding(all_tokens), lengths)
    actual, actual_lengths = pair.ours.encode(all_tokens, lengths)
    assert actual.shape == expected.shape and actual_lengths.tolist() == [expected.shape[1]]
    error = (actual - expected).abs().max().item()
    _report(record_property, f"encoder[{'meanflow' if pair.meanflow else 'standard'}]", error)
    assert error <= TOLERANCE


@torch.inference_mode()
def test_one_estimator_call_matches_reference_on_a_padded_batch(pair, record_property):
    g = torch.Generator().manual_seed(1)
    frames, lengths = 140, torch.tensor([140, 97])
    x, mu, cond = torch.randn(3, 2, 80, frames, generator=g).unbind(0)
    spks = torch.randn(2, 80, generator=g)
    mask = torch.arange(frames)[None] < lengths[:, None]
    t, r = torch.tensor([0.4, 0.1]), torch.tensor([0.9, 0.5])
    r = r if pair.meanflow else None
    expected = pair.reference.flow.decoder.estimator(x, mask[:, None].float(), mu, t, spks, cond, r=r)
    actual = pair.ours.decoder.estimator(x, mask, mu, t, spks, cond, r=r)
    error = (actual - expected).abs().max().item()
    _report(record_property, f"estimator[{'meanflow' if pair.meanflow else 'standard'}]", error)
    assert error <= TOLERANCE


def test_flow_inference_matches_reference(pair, record_property):
    prompt, tokens, prompt_mel, xvector = _inputs()
    with recorded_randn() as draws, torch.inference_mode():
        torch.manual_seed(1234)
        expected = pair.reference.flow_inference(
            tokens.clone(), ref_dict=oracle_ref_dict(prompt, prompt_mel, xvector), finalize=True)
    assert len(draws) == (2 if pair.meanflow else 1)  # the noise draws we reproduce, no others

    actual, lengths = pair.ours.inference(
        tokens, torch.tensor([NEW_TOKENS]), prompt, torch.tensor([PROMPT_TOKENS]),
        prompt_mel, torch.tensor([2 * PROMPT_TOKENS]), xvector, noise=torch.Generator().manual_seed(1234))
    assert actual.shape == expected.shape == (1, 80, 2 * NEW_TOKENS)
    assert lengths.tolist() == [2 * NEW_TOKENS]
    error = (actual - expected).abs().max().item()
    solve = "meanflow, 2 steps" if pair.meanflow else "standard, 10 steps + CFG"
    _report(record_property, f"mel[{solve}]", error)
    assert error <= TOLERANCE
