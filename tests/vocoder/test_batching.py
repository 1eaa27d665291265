"""Choosing which ready items share a pass."""
from __future__ import annotations

import pytest

from chorus.vocoder.batching import Candidate, PassCostModel, select_batch


def _candidates(lengths, keys=None):
    return [Candidate(i, n, (keys or [0] * len(lengths))[i]) for i, n in enumerate(lengths)]


def test_fifo_takes_oldest_first_within_the_padded_budget():
    assert select_batch(_candidates([10, 50, 12, 11]), 8, 100, "fifo") == [0, 1]
    assert select_batch(_candidates([10, 50, 12, 11]), 2, 10_000, "fifo") == [0, 1]


def test_length_policy_groups_items_near_the_oldest_ones_length():
    assert select_batch(_candidates([10, 50, 14, 11, 8]), 3, 10_000, "length") == [0, 3, 4]


def test_the_oldest_item_always_runs_even_over_budget():
    assert select_batch(_candidates([500, 5]), 4, 100, "length") == [0]


def test_only_items_with_the_oldest_items_solver_settings_join():
    assert select_batch(_candidates([10, 10, 10], keys=["a", "b", "a"]), 4, 1000, "fifo") == [0, 2]


def test_the_cost_model_learns_rates_and_predicts_nothing_before():
    model = PassCostModel(smoothing=0.5)
    assert model.predict(1000, 500) == 0.0
    model.observe(1000, 500, flow_seconds=0.1, hift_seconds=0.05)
    assert model.predict(2000, 1000) == pytest.approx(0.3)
    model.observe(1000, 500, flow_seconds=0.3, hift_seconds=0.05)  # half-way to the new flow rate
    assert model.flow_per_token == pytest.approx(2e-4) and model.hift_per_frame == pytest.approx(1e-4)


def test_a_time_budget_stops_filling_a_pass():
    model = PassCostModel()
    model.observe(100, 100, flow_seconds=0.01, hift_seconds=0.01)  # 1e-4 s per token and per frame
    candidates = [Candidate(i, 100, 0, frames=100) for i in range(6)]
    # each item adds 100 padded tokens and 100 frames: 0.02 s
    assert select_batch(candidates, 8, 10_000, "fifo", model, max_seconds=0.065) == [0, 1, 2]
    assert select_batch(candidates, 8, 10_000, "fifo", model, max_seconds=None) == [0, 1, 2, 3, 4, 5]
    assert select_batch(candidates, 8, 10_000, "length", model, max_seconds=0.001) == [0]  # the first always runs
