"""Parity with the reference T3 on tiny configs (2 layers, 64 wide): every variant, every path.

Each variant's reference module is built with seeded random weights, saved under its official
file name, loaded by Chorus from that file, and both run the same request: the reference
through its own inference loop (sampling scripted), Chorus through ``T3SingleSequence``.
"""
import os
import tempfile
from dataclasses import dataclass, field

import pytest
from safetensors.torch import load_file

from chorus.models.t3 import T3Model
from chorus.models.variants import T3Config, tiny_variant
from tests.models.t3.oracle_t3 import (
    TOLERANCE, Capture, Request, Scenario, build_oracle_t3, cfg_combine, make_request, max_abs_error,
    oracle_conditioning, report, run_chorus, run_oracle, save_official,
)

pytestmark = pytest.mark.oracle

CFG_VARIANTS = ["original", "multilingual"]
ALL_VARIANTS = [*CFG_VARIANTS, "turbo", "nano"]


@dataclass
class Case:
    name: str
    config: T3Config
    oracle_t3: object
    model: T3Model
    request: Request
    _runs: dict = field(default_factory=dict)

    def runs(self, scenario: Scenario) -> tuple[Capture, Capture]:
        """(reference, chorus) captures for ``scenario``, computed once."""
        if scenario not in self._runs:
            self._runs[scenario] = (
                run_oracle(self.oracle_t3, self.config, self.request, scenario),
                run_chorus(self.model, self.request, scenario),
            )
        return self._runs[scenario]


_CASES: dict[str, Case] = {}


@pytest.fixture(scope="module")
def case_for(oracle, tmp_path_factory):
    # a temporary directory that goes away (pytest's tmp dirs keep the ~100 MB of files)
    with tempfile.TemporaryDirectory(prefix="chorus-t3-tiny-", dir=tmp_path_factory.getbasetemp()) as tmp:

        def get(name: str) -> Case:
            if name not in _CASES:
                variant = tiny_variant(name)
                config = variant.t3
                t3 = build_oracle_t3(config, seed=0)
                path = os.path.join(tmp, variant.files.t3)
                save_official(t3, path)
                model = T3Model.from_state_dict(config, load_file(path), source=path)
                _CASES[name] = Case(name, config, t3, model, make_request(config, seed=1, text_len=9))
            return _CASES[name]

        yield get
    _CASES.clear()


def _default(case: Case) -> Scenario:
    # shared with the CFG tests below so that each reference run happens once
    return Scenario(0.3, cfg=case.config.supports_cfg)


@pytest.mark.parametrize("name", ALL_VARIANTS)
@pytest.mark.parametrize("exaggeration", [0.3, 0.8])
def test_conditioning_matches(case_for, name, exaggeration):
    case = case_for(name)
    want = oracle_conditioning(case.oracle_t3, case.request, exaggeration)
    got = case.model.encode_conditioning(case.request.speaker, case.request.prompt, exaggeration)
    assert report(f"tiny {name} conditioning x{exaggeration}", max_abs_error(want, got)) <= TOLERANCE


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_conditioning_without_prompt_matches(case_for, name):
    case = case_for(name)
    request = Request(case.request.speaker, None, case.request.text, ())
    want = oracle_conditioning(case.oracle_t3, request, 0.5)
    got = case.model.encode_conditioning(request.speaker, None, 0.5)
    assert got.shape[1] == case.config.cond_len_without_prompt
    assert max_abs_error(want, got) <= TOLERANCE


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_precomputed_prompt_embedding_matches(case_for, name):
    """A built-in voice may carry the reference's cached prompt embedding instead of tokens."""
    case = case_for(name)
    scenario = _default(case)
    reference, _ = case.runs(scenario)
    got = case.model.encode_conditioning(
        case.request.speaker, None, scenario.exaggeration, prompt_embeds=reference.prompt_embeds
    )
    assert max_abs_error(reference.cond, got) <= TOLERANCE


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_prefill_logits_match(case_for, name):
    case = case_for(name)
    reference, ours = case.runs(_default(case))
    assert report(f"tiny {name} prefill", max_abs_error(reference.logits[0], ours.logits[0])) <= TOLERANCE


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_decode_logits_match(case_for, name):
    case = case_for(name)
    reference, ours = case.runs(_default(case))
    assert len(ours.logits) == 21
    assert report(f"tiny {name} decode x20", max_abs_error(reference.logits[1:], ours.logits[1:])) <= TOLERANCE


@pytest.mark.parametrize("name", CFG_VARIANTS)
@pytest.mark.parametrize("exaggeration", [0.3, 0.8])
def test_cfg_combined_logits_match(case_for, name, exaggeration):
    case = case_for(name)
    reference, ours = case.runs(Scenario(exaggeration, cfg=True))
    for weight in (0.3, 0.5, 1.0):
        want = [cfg_combine(rows, weight) for rows in reference.logits]
        got = [cfg_combine(rows, weight) for rows in ours.logits]
        assert max_abs_error(want, got) <= TOLERANCE, weight


@pytest.mark.parametrize("name", CFG_VARIANTS)
def test_cfg_off_matches(case_for, name):
    """One conditional row; the reference runs it with cfg_weight 0 (as multilingual allows)."""
    case = case_for(name)
    reference, ours = case.runs(Scenario(0.5, cfg=False))
    assert ours.logits[0].shape[0] == 1
    assert max_abs_error(reference.logits, ours.logits) <= TOLERANCE


@pytest.mark.parametrize("name", CFG_VARIANTS)
def test_inputs_move_logits_well_above_tolerance(case_for, name):
    """Guards the guards: the unconditional row and the emotion value change the reference's
    logits by far more than the tolerance, so the comparisons above can fail."""
    case = case_for(name)
    low, _ = case.runs(Scenario(0.3, cfg=True))
    high, _ = case.runs(Scenario(0.8, cfg=True))
    assert max_abs_error(low.logits, high.logits) > 100 * TOLERANCE
    assert max_abs_error(low.logits[0][0], low.logits[0][1]) > 100 * TOLERANCE
