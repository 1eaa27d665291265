"""Integer helpers of block, chunk and launch sizing (the scheduler, the KV cache manager, the
engine's config checks and the attention launch plan use them)."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b`` > 0)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
