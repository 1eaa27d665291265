"""``counter_rng.mix32`` for Triton kernels: the integer hash that the sampler's kernel
(``triton_sampler``) and the vocoder's noise-tape kernel (``chorus.vocoder.triton_tapes``) share.

On uint32 values multiplication wraps mod 2**32 and ``>>`` is a logical shift, so this is the
function ``counter_rng`` emulates in int64, bit for bit by construction.
"""
from __future__ import annotations

import triton
import triton.language as tl

# counter_rng's constants (one owner: the values are read from there at import)
from chorus.sampling.counter_rng import _MIX_MULTIPLIERS

_MIX_MUL1 = tl.constexpr(_MIX_MULTIPLIERS[0])
_MIX_MUL2 = tl.constexpr(_MIX_MULTIPLIERS[1])


@triton.jit
def mix32(x):
    """counter_rng.mix32 on uint32 values (wrapping multiply, logical shifts)."""
    x = x ^ (x >> 16)
    x = x * _MIX_MUL1
    x = x ^ (x >> 15)
    x = x * _MIX_MUL2
    return x ^ (x >> 16)
