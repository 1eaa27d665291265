"""The fused RoPE + K/V write compiled for the GPU: the bits of the RoPE kernel followed by the
write kernel (fp32, bf16, FP8 pools; q/k/v as views of one projection or separate tensors), and
an engine whose Llama layers take the fused path gives the same logits as one that does not."""
from __future__ import annotations

import pytest
import torch

import chorus.engine.paged_cache as paged_cache
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine
from chorus.engine.paged_cache import PagedKVCache
from chorus.models.random_checkpoint import random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import tiny_variant
from tests.engine.attention.rope_kv_batch import (
    FP8, LAYOUTS, assert_same_bits, fused, make_rope_kv_batch, reference, two_step,
)
from tests.engine.test_engine_gpu import _requests

pytestmark = pytest.mark.gpu
needs_fp8 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                               reason="FP8 conversions need compute capability 8.9+")
# (activation dtype, pool dtype)
KINDS = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, None),
         "fp8-bf16": (torch.bfloat16, FP8), "fp8-fp32": (torch.float32, FP8)}


def _batch(kind: str, n: int, layout: str, **kw):
    dtype, pool_dtype = KINDS[kind]
    # the original T3's attention: 16 heads of 64, the engine's default block of 16
    return make_rope_kv_batch(n, layout=layout, q_heads=16, kv_heads=16, head_dim=64, block_size=16, dtype=dtype,
                              pool_dtype=pool_dtype, device="cuda", seed=n, **kw)


def _kind_params():
    return [pytest.param(k, marks=needs_fp8) if KINDS[k][1] is FP8 else k for k in KINDS]


@pytest.mark.parametrize("n", [1, 7, 64, 300])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", _kind_params())
def test_fused_kernel_equals_rope_then_write(kind, layout, n):
    batch = _batch(kind, n, layout, skip_every=5)
    assert_same_bits(fused(batch), two_step(batch))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", _kind_params())
def test_fused_kernel_equals_the_references(kind, layout):
    """Both kernels round as the tensor ops (no FP contraction; the writer's IEEE division and
    round-to-nearest-even fp8 conversion), so the references' bits too."""
    batch = _batch(kind, 64, layout, skip_every=5)
    assert_same_bits(fused(batch), reference(batch))


def _record_logits(engine: T3Engine) -> list[torch.Tensor]:
    """Every step's logits, copied as the runner computes them."""
    logits: list[torch.Tensor] = []
    forward_logits = engine.runner.forward_logits

    def recording(inputs):
        out = forward_logits(inputs)
        logits.append(out.clone())
        return out

    engine.runner.forward_logits = recording
    return logits


@pytest.mark.parametrize("kv_cache_dtype", [
    pytest.param("auto", id="model-dtype-pool"), pytest.param("fp8_e4m3", marks=needs_fp8, id="fp8-pool")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_engine_logits_are_the_same_with_the_fused_path(dtype, kv_cache_dtype, monkeypatch):
    """A tiny Llama T3 through the engine (CUDA graphs for decode, eager prefill): every step's
    logits, fused RoPE + K/V write on and off."""
    variant = tiny_variant("original", layers=2, hidden=128, heads=2)  # head_dim 64
    state = random_state_dict(t3_key_specs(variant), seed=0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8
    model = T3Model.from_state_dict(variant.t3, state, dtype=dtype, device="cuda", source="random")
    reqs = _requests(variant, model, 4, tokens=12)
    real = paged_cache.rope_write_kv
    runs = []
    for fuse in (True, False):
        calls = [0]

        def counting(*args, **kwargs):
            calls[0] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(paged_cache, "rope_write_kv", counting)
        if not fuse:  # the two-step path on the same backends, before the graphs are captured
            monkeypatch.setattr(PagedKVCache, "_fuses_rotary", lambda self, q, ops_backend: False)
        config = EngineConfig(variant=variant.name, default_deadline_s=None,
                              cache=CacheConfig(kv_cache_bytes=64 << 20, kv_cache_dtype=kv_cache_dtype),
                              scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1024,
                                                        max_model_len=512))
        engine = T3Engine(model, variant, config, cuda_graphs=True)
        assert engine.runner.graphs is not None
        logits = _record_logits(engine)
        tokens = [r.tokens for r in engine.generate(reqs)]
        assert (calls[0] > 0) == fuse, calls[0]
        runs.append((tokens, logits))
    (tokens_on, logits_on), (tokens_off, logits_off) = runs
    assert tokens_on == tokens_off
    assert len(logits_on) == len(logits_off) > 1
    for step, (a, b) in enumerate(zip(logits_on, logits_off)):
        assert torch.equal(a, b), f"step {step}: max |diff| {(a - b).abs().max()}"
