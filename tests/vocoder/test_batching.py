"""Choosing which ready items share a pass."""
from __future__ import annotations

from chorus.vocoder.batching import Candidate, select_batch


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
