import pytest
import torch

from chorus.models.checkpoint import CheckpointMismatchError, check_state_dict, compare_state_dict

EXPECTED = {"a.weight": (2, 3), "a.bias": (2,), "b.weight": (4,)}


def _state(**over):
    state = {"a.weight": torch.zeros(2, 3), "a.bias": torch.zeros(2), "b.weight": torch.zeros(4)}
    state.update(over)
    return {k: v for k, v in state.items() if v is not None}


def test_matching_state_passes():
    check_state_dict(_state(), EXPECTED, "x.safetensors")


def test_report_lists_missing_unexpected_and_wrong_shape():
    state = _state(**{"a.bias": None, "c.weight": torch.zeros(1), "b.weight": torch.zeros(5)})
    with pytest.raises(CheckpointMismatchError) as info:
        check_state_dict(state, EXPECTED, "x.safetensors")
    report = info.value.report
    assert report.missing == ["a.bias"] and report.unexpected == ["c.weight"]
    assert report.wrong_shape == [("b.weight", (4,), (5,))]
    text = str(info.value)
    assert "x.safetensors" in text and "missing keys (1)" in text and "expected [4], found [5]" in text


def test_optional_keys_may_be_absent_but_not_misshapen():
    assert compare_state_dict(_state(**{"a.bias": None}), EXPECTED, "x", optional={"a.bias"}).ok
    bad = compare_state_dict(_state(**{"a.bias": torch.zeros(3)}), EXPECTED, "x", optional={"a.bias"})
    assert not bad.ok


def test_long_reports_are_truncated():
    expected = {f"k{i}": (1,) for i in range(40)}
    with pytest.raises(CheckpointMismatchError, match="and 28 more"):
        check_state_dict({}, expected, "x")
