from __future__ import annotations

import pytest

from chorus.models.variants import get_variant
from chorus.sampling import InvalidSamplingParams, SamplingBatch, SamplingParams

EN = get_variant("original")
TURBO = get_variant("turbo")


def test_en_defaults_come_from_the_variant():
    p = SamplingParams.for_variant(EN)
    assert (p.temperature, p.top_p, p.min_p, p.top_k, p.repetition_penalty, p.cfg_weight, p.max_new_tokens) == (
        0.8, 1.0, 0.05, 0, 1.2, 0.5, 1000)
    assert p.ignored == ()


def test_turbo_defaults_come_from_the_variant():
    p = SamplingParams.for_variant(TURBO)
    assert (p.temperature, p.top_p, p.min_p, p.top_k, p.repetition_penalty, p.cfg_weight, p.max_new_tokens) == (
        0.8, 0.95, 0.0, 1000, 1.2, 0.0, 1001)


def test_overrides_replace_defaults_and_none_keeps_them():
    p = SamplingParams.for_variant(EN, temperature=0.5, top_p=None, seed=3)
    assert (p.temperature, p.top_p, p.seed) == (0.5, 1.0, 3)


@pytest.mark.parametrize("name, value", [
    ("temperature", -0.1), ("temperature", 1e-5), ("temperature", float("nan")),
    ("top_p", 0.0), ("top_p", 1.01), ("min_p", -0.01), ("min_p", 1.5), ("top_k", -1), ("top_k", 2.5),
    ("repetition_penalty", 0.0), ("repetition_penalty", float("inf")), ("cfg_weight", -0.5),
    ("seed", -1), ("seed", 2**64), ("max_new_tokens", 0), ("min_new_tokens", 2000), ("top_k", True),
    ("ignore_eos", 1),
])
def test_out_of_range_values_name_the_parameter(name, value):
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams.for_variant(EN, **{name: value})
    assert err.value.param == name
    assert name in str(err.value)


def test_unknown_parameter_is_a_type_error_listing_the_allowed_ones():
    with pytest.raises(TypeError, match="top_p"):
        SamplingParams.for_variant(EN, exaggeration=0.7)


def test_turbo_ignores_cfg_and_min_p_and_says_so():
    p = SamplingParams.for_variant(TURBO, cfg_weight=0.7, min_p=0.1, temperature=0.6)
    assert (p.cfg_weight, p.min_p, p.temperature) == (0.0, 0.0, 0.6)
    assert p.ignored == ("cfg_weight", "min_p")


def test_invalid_values_are_rejected_even_where_ignored():
    with pytest.raises(InvalidSamplingParams):
        SamplingParams.for_variant(TURBO, cfg_weight=-1.0)


def test_en_ignores_top_k():
    p = SamplingParams.for_variant(EN, top_k=50)
    assert p.top_k == 0 and p.ignored == ("top_k",)


def test_missing_seed_is_drawn_once_and_kept():
    p = SamplingParams.for_variant(EN)
    assert isinstance(p.seed, int) and 0 <= p.seed < 2**64
    assert SamplingParams.for_variant(EN).seed != p.seed


def test_zero_temperature_means_greedy():
    assert SamplingParams.for_variant(EN, temperature=0).greedy
    assert not SamplingParams.for_variant(EN).greedy


def test_batch_rejects_parameters_the_variant_does_not_run():
    with pytest.raises(ValueError, match="for_variant"):
        SamplingBatch.build([SamplingParams(cfg_weight=0.5, min_p=0.0)], TURBO)
