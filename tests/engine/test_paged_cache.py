"""``PagedKVCache.attend_rotary``: the fused RoPE + K/V write path (Triton, here under the
interpreter) and the two-step path give the same bits; the PyTorch path is ``rope_qk`` then
``attend``; calibration keeps the two steps."""
from __future__ import annotations

import os

import pytest
import torch

import chorus.engine.paged_cache as paged_cache
from chorus.engine.attention import triton_available
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from chorus.models.t3.fused_ops import rope_qk

HEADS, HEAD_DIM, BLOCK, BLOCKS = 2, 32, 8, 4
FP8 = torch.float8_e4m3fn
interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or not triton_available(),
    reason="needs Triton and TRITON_INTERPRET=1 (set by tests/conftest.py when there is no GPU)")


def _cache(backend: str, dtype=torch.float32, *, fuse: bool = True) -> PagedKVCache:
    cache = PagedKVCache(1, BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=dtype, device="cpu", backend=backend)
    if not fuse:  # the two-step path on the same backends
        cache._fuses_rotary = lambda q, ops_backend: False
    if cache.quantized:
        cache.set_kv_scales(torch.tensor([[0.05, 0.02]]))
    return cache


def _steps(seed: int = 0):
    """A prefill of 11 tokens (q, k, v views of one projection), then one decode token
    (separate tensors): (start, q, k, v, cos, sin) per step."""
    g = torch.Generator().manual_seed(seed)
    steps, start = [], 0
    for n, fused_projection in ((11, True), (1, False)):
        if fused_projection:
            q, k, v = torch.randn(n, 3 * HEADS, HEAD_DIM, generator=g).split(HEADS, dim=1)
        else:
            q, k, v = (torch.randn(n, HEADS, HEAD_DIM, generator=g) for _ in range(3))
        angles = torch.rand(n, 1, HEAD_DIM // 2, generator=g) * 50
        angles = torch.cat((angles, angles), dim=-1)
        steps.append((start, q, k, v, angles.cos(), angles.sin()))
        start += n
    return steps


def _run(cache: PagedKVCache, ops_backend: str, *, rotary: bool = True) -> list[torch.Tensor]:
    outs = []
    for start, q, k, v, cos, sin in _steps():
        cache.metadata = AttentionMetadata.single_row(start, q.shape[0], BLOCKS, "cpu")
        if rotary:
            outs.append(cache.attend_rotary(0, q, k, v, cos, sin, ops_backend))
        else:
            q, k = rope_qk(q, k, cos, sin, ops_backend)
            outs.append(cache.attend(0, q, k, v))
    return outs


def _assert_same(a: PagedKVCache, b: PagedKVCache, outs_a, outs_b) -> None:
    for x, y in zip(outs_a, outs_b):
        assert torch.equal(x, y)
    assert torch.equal(a.kv.view(torch.uint8), b.kv.view(torch.uint8))


def _count_fused(monkeypatch) -> list[int]:
    calls = [0]
    real = paged_cache.rope_write_kv

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(paged_cache, "rope_write_kv", counting)
    return calls


def test_torch_path_is_rope_then_attend(monkeypatch):
    calls = _count_fused(monkeypatch)
    a, b = _cache("torch"), _cache("torch")
    _assert_same(a, b, _run(a, "torch"), _run(b, "torch", rotary=False))
    assert calls[0] == 0


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, FP8])
def test_fused_path_equals_the_two_steps(dtype, monkeypatch):
    calls = _count_fused(monkeypatch)
    fused, two_step = _cache("triton", dtype), _cache("triton", dtype, fuse=False)
    outs = _run(fused, "triton")
    assert calls[0] == 2
    _assert_same(fused, two_step, outs, _run(two_step, "triton"))
    assert calls[0] == 2


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fused_path_needs_both_backends_on_triton(monkeypatch):
    calls = _count_fused(monkeypatch)
    _run(_cache("triton"), "torch")
    _run(_cache("torch"), "triton")
    assert calls[0] == 0


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_calibration_takes_the_two_steps_and_records_rotated_keys(monkeypatch):
    calls = _count_fused(monkeypatch)
    cache = _cache("triton")
    cache.observed_amax = torch.zeros(1, 2)
    _run(cache, "triton")
    assert calls[0] == 0
    rotated_k = [rope_qk(q, k, cos, sin, "torch")[1] for _, q, k, _, cos, sin in _steps()]
    assert cache.observed_amax[0, 0] == max(k.abs().max() for k in rotated_k)


def _count(monkeypatch, module, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def _three_layer_step(cache: PagedKVCache, ops_backend: str = "triton") -> AttentionMetadata:
    """One eager prefill step of 11 tokens through three layers (each a fused-or-not attend_rotary)."""
    start, q, k, v, cos, sin = _steps()[0]
    meta = AttentionMetadata.single_row(start, q.shape[0], BLOCKS, "cpu")
    cache.metadata = meta
    for layer in range(3):
        cache.attend_rotary(layer, q, k, v, cos, sin, ops_backend)
    return meta


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_step_plans_its_attention_launches_once_for_all_layers(monkeypatch):
    import chorus.engine.attention.triton_paged as triton_paged
    from chorus.engine.attention.launch_plan import num_sms, plan_attention

    planned, per_call = _count(monkeypatch, paged_cache, "plan_attention"), _count(monkeypatch, triton_paged,
                                                                                   "plan_attention")
    cache = PagedKVCache(3, BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=torch.float32, device="cpu", backend="triton")
    meta = _three_layer_step(cache)
    assert planned[0] == 1 and per_call[0] == 0
    assert meta.attention_plan == plan_attention(1, 11, 11, 0, 11, HEADS, num_sms(torch.device("cpu")))


@interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_backend_decisions_are_made_once_not_per_layer(monkeypatch):
    from chorus.models.t3 import fused_ops

    attention, ops = _count(monkeypatch, paged_cache, "uses_triton"), _count(monkeypatch, fused_ops, "uses_triton")
    cache = PagedKVCache(3, BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=torch.float32, device="cpu", backend="triton")
    _three_layer_step(cache)
    _three_layer_step(cache)
    assert attention[0] == 1 and ops[0] == 1


def test_the_pytorch_path_plans_no_launches():
    cache = PagedKVCache(3, BLOCKS, BLOCK, HEADS, HEAD_DIM, dtype=torch.float32, device="cpu", backend="torch")
    assert _three_layer_step(cache, "torch").attention_plan is None
