"""The integer hash behind the sampler's noise: exact uint32 arithmetic, uniform output."""
from __future__ import annotations

import torch

from chorus.sampling.counter_rng import mix32, seed_lanes, seed_lanes_of, split_seed, uniform01, uniform_hash

EDGES = [0, 1, 2**15, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 0x9E3779B9, 123456789]


def _mix32_python(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_matches_unbounded_integer_arithmetic():
    values = EDGES + torch.randint(0, 2**32, (2000,), generator=torch.Generator().manual_seed(0)).tolist()
    out = mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert out == [_mix32_python(v) for v in values]


def test_hashes_stay_in_uint32_range_for_extreme_seeds_and_steps():
    seeds = [split_seed(s) for s in (0, 2**64 - 1, 2**63, 2**32 - 1)]
    lanes = seed_lanes(torch.tensor(seeds, dtype=torch.int64))
    h = uniform_hash(lanes, torch.tensor([0, 2**32 - 1, 2**31, 7]), 8194)
    assert h.min() >= 0 and h.max() < 2**32


def test_uniforms_are_in_the_open_unit_interval_and_look_uniform():
    lanes = seed_lanes(torch.tensor([split_seed(s) for s in range(64)], dtype=torch.int64))
    u = uniform01(lanes, torch.arange(64), 8194)
    assert 0.0 < u.min() and u.max() < 1.0
    counts = torch.histc(u.float(), bins=64, min=0.0, max=1.0)
    expected = u.numel() / 64
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 120.0  # 63 degrees of freedom: p < 1e-5 above this
    assert abs(u.mean().item() - 0.5) < 1e-3


def test_neighbouring_steps_and_seeds_are_uncorrelated():
    lanes = seed_lanes(torch.tensor([split_seed(s) for s in (5, 5, 6)], dtype=torch.int64))
    u = uniform01(lanes, torch.tensor([10, 11, 10]), 8194)
    corr = torch.corrcoef(u)
    assert corr[0, 1].abs() < 0.05 and corr[0, 2].abs() < 0.05


def test_seed_lanes_of_a_numpy_array_equal_those_of_a_tensor():
    import numpy as np

    words = [split_seed(s) for s in (0, 1, 2**63 + 5, 2**64 - 1, 123456789)]
    assert np.array_equal(seed_lanes(np.array(words, dtype=np.int64)),
                          seed_lanes(torch.tensor(words, dtype=torch.int64)).numpy())


def test_one_seeds_lanes_in_python_integers_equal_its_row_of_seed_lanes():
    import numpy as np

    seeds = (0, 1, 2**32 - 1, 2**32, 2**63 + 5, 2**64 - 1, 123456789)
    rows = seed_lanes(np.array([split_seed(s) for s in seeds], dtype=np.int64))
    for seed, row in zip(seeds, rows):
        assert seed_lanes_of(seed) == tuple(int(x) for x in row)
