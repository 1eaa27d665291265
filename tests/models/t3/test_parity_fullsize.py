"""Parity with the reference T3 at full size, CPU fp32: original, multilingual (v2 file and
code path), turbo and nano.

Per variant: the reference module is built with seeded random weights (rescaled so that every
input matters, norms perturbed), saved under the official file name, run through its own
inference loop with scripted sampling, and freed; Chorus then loads that file and runs the
same requests. Compared: conditioning embeddings, prefill logits, and 10 decode steps of
logits (both CFG rows where the variant has CFG). Only one full-size model is alive at a time.
Exaggeration enters T3 only through the conditioning, so the original's second exaggeration
compares the conditioning alone (a second decode would cost a third of the file's time).
"""
import gc
import os
import tempfile
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file

from chorus.models.t3 import T3Model
from chorus.models.variants import get_variant
from tests.models.t3.oracle_t3 import (
    TOLERANCE, Capture, Scenario, build_oracle_t3, cfg_combine, make_request, max_abs_error,
    oracle_conditioning, report, run_chorus, run_oracle, save_official,
)

pytestmark = [pytest.mark.oracle, pytest.mark.fullsize]

SCENARIOS = {
    # cfg_weight only enters the combine, so one run per exaggeration covers every weight
    "original": (Scenario(0.3, cfg=True),),
    "multilingual": (Scenario(0.5, cfg=True), Scenario(0.5, cfg=False)),
    "turbo": (Scenario(0.0, cfg=False),),
    "nano": (Scenario(0.0, cfg=False),),
}
CFG_WEIGHTS = (0.3, 0.5, 1.0)
DECODE_STEPS = 10
# conditioning alone at a second exaggeration (variants with an emotion input)
CONDITIONING_ONLY = {"original": 0.8}


@dataclass
class Results:
    name: str
    reference: dict[Scenario, Capture]
    chorus: dict[Scenario, Capture]
    # the conditioning [1, C, D] at CONDITIONING_ONLY's exaggeration: (reference, chorus), or None
    second_exaggeration: tuple[torch.Tensor, torch.Tensor] | None


@pytest.fixture(scope="module", params=list(SCENARIOS))
def results(request, oracle, tmp_path_factory) -> Results:
    name = request.param
    variant = get_variant(name)
    config = variant.t3
    inputs = make_request(config, seed=1, text_len=12, steps=DECODE_STEPS)
    scenarios = SCENARIOS[name]
    exaggeration = CONDITIONING_ONLY.get(name)
    with tempfile.TemporaryDirectory(prefix="chorus-t3-parity-", dir=tmp_path_factory.getbasetemp()) as tmp:
        path = os.path.join(tmp, variant.files.t3)
        t3 = build_oracle_t3(config, seed=0)
        save_official(t3, path)
        reference = {s: run_oracle(t3, config, inputs, s) for s in scenarios}
        if exaggeration is not None:
            reference_cond = oracle_conditioning(t3, inputs, exaggeration)
        del t3
        gc.collect()
        model = T3Model.from_state_dict(config, load_file(path), source=path)
        ours = {s: run_chorus(model, inputs, s) for s in scenarios}
        second = None
        if exaggeration is not None:
            with torch.inference_mode():
                second = (reference_cond, model.encode_conditioning(inputs.speaker, inputs.prompt, exaggeration))
        del model
        gc.collect()
    return Results(name, reference, ours, second)


def _scenario_label(s: Scenario) -> str:
    return f"x{s.exaggeration} {'cfg' if s.cfg else 'no-cfg'}"


def test_conditioning_matches(results):
    for scenario, reference in results.reference.items():
        error = max_abs_error(reference.cond, results.chorus[scenario].cond)
        assert report(f"{results.name} conditioning {_scenario_label(scenario)}", error) <= TOLERANCE
    if results.second_exaggeration is not None:
        reference, ours = results.second_exaggeration
        label = f"{results.name} conditioning x{CONDITIONING_ONLY[results.name]}"
        assert report(label, max_abs_error(reference, ours)) <= TOLERANCE


def test_prefill_logits_match(results):
    for scenario, reference in results.reference.items():
        error = max_abs_error(reference.logits[0], results.chorus[scenario].logits[0])
        assert report(f"{results.name} prefill {_scenario_label(scenario)}", error) <= TOLERANCE


def test_decode_logits_match(results):
    for scenario, reference in results.reference.items():
        ours = results.chorus[scenario]
        assert len(ours.logits) == len(reference.logits) == DECODE_STEPS + 1
        error = max_abs_error(reference.logits[1:], ours.logits[1:])
        label = f"{results.name} decode x{DECODE_STEPS} {_scenario_label(scenario)}"
        assert report(label, error) <= TOLERANCE


def test_cfg_combined_logits_match(results):
    cfg_runs = [s for s in results.reference if s.cfg]
    if not cfg_runs:
        pytest.skip(f"{results.name} has no CFG")
    for scenario in cfg_runs:
        for weight in CFG_WEIGHTS:
            want = [cfg_combine(rows, weight) for rows in results.reference[scenario].logits]
            got = [cfg_combine(rows, weight) for rows in results.chorus[scenario].logits]
            error = max_abs_error(want, got)
            label = f"{results.name} cfg-combined w={weight} {_scenario_label(scenario)}"
            assert report(label, error) <= TOLERANCE


def test_inputs_move_logits_well_above_tolerance(results):
    """The comparisons above can fail: the fed tokens, the unconditional row and the emotion
    value each move the reference's logits by far more than the tolerance."""
    runs = list(results.reference.values())
    logits = runs[0].logits
    assert max_abs_error(logits[1:], logits[:-1]) > 100 * TOLERANCE
    if logits[0].shape[0] == 2:
        assert max_abs_error(logits[0][0], logits[0][1]) > 100 * TOLERANCE
    if results.second_exaggeration is not None:
        first_cond = runs[0].cond
        assert max_abs_error(first_cond, results.second_exaggeration[0]) > 100 * TOLERANCE
