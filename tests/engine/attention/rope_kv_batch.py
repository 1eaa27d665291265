"""Inputs of the fused RoPE + K/V write (``rope_write_kv``), shared by its interpreter and GPU
tests: q, k, v as views of one projection output or as separate tensors, rotary tables, a paged
pool filled with noise (so that a skipped or misplaced write shows) and a slot per token."""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
LAYOUTS = ("views", "separate")


@dataclass
class RopeKVBatch:
    q: torch.Tensor            # [N, Hq, D], not yet rotated
    k: torch.Tensor            # [N, Hk, D], not yet rotated
    v: torch.Tensor            # [N, Hk, D]
    cos: torch.Tensor          # [N, 1, D] in q's dtype
    sin: torch.Tensor
    key_cache: torch.Tensor    # [num_blocks, block_size, Hk, D], the pool's dtype
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [N] int64, -1: no cache write
    k_scale: torch.Tensor | None  # [1] fp32, FP8 pools only
    v_scale: torch.Tensor | None

    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh copies of the pool (each path under test writes its own)."""
        return self.key_cache.clone(), self.value_cache.clone()


def make_rope_kv_batch(n: int, *, layout: str, q_heads: int = 4, kv_heads: int = 4, head_dim: int = 64,
                       block_size: int = 16, dtype: torch.dtype = torch.float32, pool_dtype: torch.dtype | None = None,
                       skip_every: int = 0, device: str = "cpu", seed: int = 0) -> RopeKVBatch:
    """``n`` tokens written to distinct slots of a shuffled pool (``n + 8`` slots, rounded up to
    whole blocks); with ``skip_every``, every ``skip_every``-th token's slot is -1."""
    assert layout in LAYOUTS, layout
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype)

    if layout == "views":
        qkv = randn(n, (q_heads + 2 * kv_heads) * head_dim)
        q, k, v = qkv.split((q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
        q, k, v = q.view(n, q_heads, head_dim), k.view(n, kv_heads, head_dim), v.view(n, kv_heads, head_dim)
    else:
        q, k, v = randn(n, q_heads, head_dim), randn(n, kv_heads, head_dim), randn(n, kv_heads, head_dim)
    angles = torch.rand(n, 1, head_dim // 2, generator=g) * 100
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)

    num_blocks = -(-(n + 8) // block_size)
    pool_dtype = pool_dtype or dtype
    noise = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=g).to(device)
    key_cache, value_cache = noise[0].to(pool_dtype), noise[1].to(pool_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n].to(device)
    if skip_every:
        slots[::skip_every] = -1
    k_scale = v_scale = None
    if pool_dtype == FP8:
        k_scale = torch.tensor([0.05], device=device)
        v_scale = torch.tensor([0.02], device=device)
    return RopeKVBatch(q, k, v, cos, sin, key_cache, value_cache, slots, k_scale, v_scale)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (torch.equal does not take every dtype, FP8 among them)."""
    return t.contiguous().view(torch.uint8)


def fused(batch: RopeKVBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one-kernel path: (rotated q, key cache, value cache)."""
    from chorus.engine.attention.triton_paged import rope_write_kv_triton

    key_cache, value_cache = batch.caches()
    q = rope_write_kv_triton(batch.q, batch.k, batch.v, batch.cos, batch.sin, key_cache, value_cache,
                             batch.slot_mapping, k_scale=batch.k_scale, v_scale=batch.v_scale)
    return q, key_cache, value_cache


def two_step(batch: RopeKVBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The RoPE kernel, then the K/V write kernel: what the fused kernel must equal bit for bit."""
    from chorus.engine.attention.triton_paged import write_kv_triton
    from chorus.models.t3.triton_ops import rope_qk_triton

    key_cache, value_cache = batch.caches()
    q, k = rope_qk_triton(batch.q, batch.k, batch.cos, batch.sin)
    write_kv_triton(key_cache, value_cache, k, batch.v, batch.slot_mapping, k_scale=batch.k_scale,
                    v_scale=batch.v_scale)
    return q, key_cache, value_cache


def reference(batch: RopeKVBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The PyTorch references in turn."""
    from chorus.engine.attention import rope_write_kv

    key_cache, value_cache = batch.caches()
    q = rope_write_kv(batch.q, batch.k, batch.v, batch.cos, batch.sin, key_cache, value_cache,
                      batch.slot_mapping, k_scale=batch.k_scale, v_scale=batch.v_scale, backend="torch")
    return q, key_cache, value_cache


def assert_same_bits(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for name, a, b in zip(("q", "key cache", "value cache"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
        assert torch.equal(bits(a), bits(b)), f"{name} differs in {(bits(a) != bits(b)).sum()} bytes"
