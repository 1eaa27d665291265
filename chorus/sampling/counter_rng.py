"""Counter-based random numbers in plain torch integer ops.

A uniform for (seed, step, token) is a pure function of those three numbers, so a request's
noise never depends on the rest of the batch, needs no generator state, and is bit-identical on
CPU and CUDA (integer ops only; floats enter at the very end through an exact conversion).

All values are uint32 held in int64 tensors. Products are split so no intermediate exceeds
2**48: torch int64 overflow is undefined behaviour in C++, and keeping every value non-negative
makes ``>>`` a logical shift.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_MASK16 = 0xFFFF
_MASK32 = 0xFFFFFFFF
# Odd constants (golden ratio and murmur3 finaliser words) to separate the hash lanes.
_LANE_SALTS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F)
# mix32's two multipliers ("lowbias32"); the Triton kernels read them (triton_mix.py), the
# sampler's (triton_sampler.py) the salts too.
_MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)


def _mul_mod32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32) without int64 overflow."""
    low = x & _MASK16
    high = x >> 16
    return (low * constant + (((high * constant) & _MASK16) << 16)) & _MASK32


def mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash (xorshift-multiply, "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = _mul_mod32(x, _MIX_MULTIPLIERS[0])
    x = x ^ (x >> 15)
    x = _mul_mod32(x, _MIX_MULTIPLIERS[1])
    return x ^ (x >> 16)


def split_seed(seed: int) -> tuple[int, int]:
    """A 64-bit seed as its (low, high) 32-bit words."""
    assert 0 <= seed < 2**64, seed
    return seed & _MASK32, seed >> 32


def _lanes(low, high):
    """The two hashed lanes of (low, high) seed words: ints, numpy arrays or tensors alike."""
    return mix32(mix32(low ^ _LANE_SALTS[0]) ^ high), mix32(mix32(high ^ _LANE_SALTS[1]) ^ low)


def seed_lanes_of(seed: int) -> tuple[int, int]:
    """One 64-bit seed's lanes, in Python integers (a row of :func:`seed_lanes`, without the
    array operations that cost a single seed far more than the arithmetic)."""
    return _lanes(*split_seed(seed))


def seed_lanes(seed_words: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """[R, 2] (low, high) seed words -> [R, 2] hashed lanes; depends on the seed only, so it
    is computed once per batch composition. Takes an int64 tensor or numpy array (the same
    integer ops; numpy is far cheaper for the host-side batch build) and returns the same kind."""
    lane0, lane1 = _lanes(seed_words[:, 0], seed_words[:, 1])
    if isinstance(seed_words, np.ndarray):
        return np.stack([lane0, lane1], axis=1)
    return torch.stack([lane0, lane1], dim=1)


def uniform_hash(lanes: Tensor, steps: Tensor, vocab_size: int) -> Tensor:
    """[R, V] uint32 hashes (int64 tensor) of (seed lanes [R, 2], step [R], token index)."""
    step = (steps.to(torch.int64) & _MASK32)
    key0 = mix32(lanes[:, 0] ^ mix32(step ^ _LANE_SALTS[2]))[:, None]
    key1 = mix32(lanes[:, 1] ^ mix32(step ^ _LANE_SALTS[3]))[:, None]
    tokens = mix32(torch.arange(vocab_size, device=lanes.device, dtype=torch.int64))[None, :]
    return mix32(mix32(tokens ^ key0) ^ key1)


def uniform01(lanes: Tensor, steps: Tensor, vocab_size: int) -> Tensor:
    """[R, V] float64 uniforms in the open interval (0, 1); exact, device-independent."""
    h = uniform_hash(lanes, steps, vocab_size)
    return (h.to(torch.float64) + 0.5) * (2.0**-32)


def gumbel_noise(lanes: Tensor, steps: Tensor, vocab_size: int) -> Tensor:
    """[R, V] float64 ``-log(E)`` with E ~ Exp(1): adding it to logits and taking the argmax
    is the exponential race ``argmax(probs / E)``, i.e. one draw from ``softmax(logits)``."""
    exponential = -torch.log(uniform01(lanes, steps, vocab_size))
    return -torch.log(exponential)
