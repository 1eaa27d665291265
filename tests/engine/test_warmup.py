"""The kernel warm-up's plan enumeration, its scratch launches and its CPU no-op (CPU tests).

The GPU check that a mixed workload compiles nothing after the warm-up is test_warmup_gpu.py.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from chorus.engine.attention.launch_plan import StepLimits, plan_attention, reachable_launches
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine
from chorus.engine.paged_cache import PagedKVCache
from tests.engine.tiny_models import tiny


def _covered(limits: StepLimits, heads: int, num_sms: int, batches) -> None:
    reachable = reachable_launches(limits, heads, num_sms)
    for num_decodes, prefill_rows, prefill_tokens, max_query_len, max_seq_len in batches:
        num_seqs = num_decodes + prefill_rows
        sharing = (False, True) if limits.shared_prefix_min_rows is not None \
            and num_decodes >= limits.shared_prefix_min_rows else (False,)
        for shared in sharing:
            plan = plan_attention(num_seqs, num_decodes + prefill_tokens, max_query_len, num_decodes, max_seq_len,
                                  heads, num_sms, shared=shared)
            missing = [launch for launch in plan.launches() if launch not in reachable]
            assert not missing, (num_decodes, prefill_rows, prefill_tokens, max_query_len, max_seq_len, missing)


def _all_batches(limits: StepLimits):
    """Every (decode rows, prefill rows, prefill tokens, longest prefill chunk, longest context)
    a step within ``limits`` can have."""
    rows, tokens, context = limits.max_rows, limits.max_tokens, limits.max_seq_len
    for num_decodes, prefill_rows in itertools.product(range(rows + 1), repeat=2):
        if not 0 < num_decodes + prefill_rows <= rows:
            continue
        if prefill_rows == 0:  # decode only
            if num_decodes <= tokens:
                yield from ((num_decodes, 0, 0, 1, s) for s in range(1, context + 1))
            continue
        for prefill_tokens in range(prefill_rows + 1, tokens - num_decodes + 1):
            for longest in range(2, min(prefill_tokens - prefill_rows + 1, context) + 1):
                if longest * prefill_rows < prefill_tokens:
                    continue
                yield from ((num_decodes, prefill_rows, prefill_tokens, longest, s)
                            for s in range(longest, context + 1))


def test_enumeration_covers_every_batch_of_small_limits():
    limits = StepLimits(max_rows=6, max_tokens=40, max_seq_len=80, shared_prefix_min_rows=3)
    _covered(limits, heads=2, num_sms=4, batches=_all_batches(limits))


@pytest.mark.parametrize("heads, num_sms", [(16, 132), (16, 78), (4, 4)])
def test_enumeration_covers_swept_batches_at_engine_scale(heads, num_sms):
    """Random steps up to the bench's limits (512 rows, 16384 tokens, 2048 positions)."""
    limits = StepLimits(max_rows=512, max_tokens=16384, max_seq_len=2048, shared_prefix_min_rows=32)
    rng = random.Random(0)

    def batches():
        for _ in range(3000):
            num_decodes = rng.choice([0, 1, 2, 3, 5, 17, 31, 32, 33, 64, 100, 255, 511, rng.randint(0, 512)])
            prefill_rows = rng.randint(0 if num_decodes else 1, min(8, 512 - num_decodes))
            if prefill_rows == 0:
                yield num_decodes, 0, 0, 1, rng.randint(1, 2048)
                continue
            budget = 16384 - num_decodes
            prefill_tokens = rng.randint(prefill_rows + 1, min(budget, prefill_rows * 2048))
            longest = max(2, -(-prefill_tokens // prefill_rows))
            longest = rng.randint(longest, min(prefill_tokens - prefill_rows + 1, 2048))
            yield num_decodes, prefill_rows, prefill_tokens, longest, rng.randint(longest, 2048)

    _covered(limits, heads, num_sms, batches())


def test_enumeration_without_shared_prefix_has_no_shared_launches():
    limits = StepLimits(max_rows=64, max_tokens=512, max_seq_len=256)
    launches = reachable_launches(limits, heads=4, num_sms=132)
    assert launches and all(hasattr(launch, "block_q") and not launch.kv_start for launch in launches)


def test_warm_up_is_a_no_op_on_the_cpu(monkeypatch):
    import chorus.engine.warmup as warmup

    def refuse(*args, **kwargs):
        raise AssertionError("the warm-up enumerated plans on the CPU")

    monkeypatch.setattr(warmup, "reachable_launches", refuse)
    variant, model = tiny("original")
    config = EngineConfig(variant=variant.name, cache=CacheConfig(kv_cache_bytes=16 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512))
    assert config.warm_up_kernels
    engine = T3Engine(model, variant, config)
    assert engine.warmup is None
    limits = warmup.step_limits(config.scheduler, 32)
    assert warmup.warm_up_kernels(model, engine.kv_cache, limits, sampler_vocab=8) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_scratch_launches_run_every_plan_and_leave_the_cache_alone(dtype):
    """Under the Triton interpreter: each reachable launch of small limits runs through the
    step's functions on its scratch batch (which checks that the batch plans to it), and
    neither they nor the scratch forward change a byte of the pool."""
    import chorus.engine.warmup as warmup

    variant, model = tiny("original")
    bb = variant.t3.backbone
    cache = PagedKVCache(bb.num_layers, 8, 16, bb.num_kv_heads, bb.head_dim, dtype=dtype, device="cpu",
                         backend="triton")
    cache.kv.copy_(torch.randn(cache.kv.shape).to(dtype))
    before = cache.kv.clone()
    limits = StepLimits(max_rows=6, max_tokens=40, max_seq_len=80, shared_prefix_min_rows=3)
    launched = warmup._warm_attention(cache, torch.float32, limits)
    assert launched == len(reachable_launches(limits, bb.num_kv_heads, 4))
    warmup._warm_forward(model, cache)
    assert torch.equal(cache.kv.view(torch.uint8), before.view(torch.uint8))
    assert cache.metadata is None


def test_an_fp8_pool_warms_the_shared_prefix_launches_with_its_scales(monkeypatch):
    """The scratch shared-prefix launches of an FP8 pool take the layer-0 scales, so they compile
    the ``HAS_SCALE`` variants the steps launch (an unscaled pool passes none)."""
    import chorus.engine.attention.triton_shared_prefix as triton_shared_prefix
    import chorus.engine.warmup as warmup
    from chorus.engine.attention.launch_plan import SharedLaunch

    seen = []
    monkeypatch.setattr(triton_shared_prefix, "shared_prefix_decode_triton",
                        lambda *args, k_scale=None, v_scale=None, **kw: seen.append((k_scale, v_scale)))
    monkeypatch.setattr(warmup, "_paged_launch", lambda *args: None)
    variant, model = tiny("original")
    bb = variant.t3.backbone
    limits = StepLimits(max_rows=6, max_tokens=40, max_seq_len=80, shared_prefix_min_rows=3)
    shared = [launch for launch in reachable_launches(limits, bb.num_kv_heads, 4) if isinstance(launch, SharedLaunch)]
    assert shared
    for dtype in (torch.float32, torch.float8_e4m3fn):
        seen.clear()
        cache = PagedKVCache(bb.num_layers, 8, 16, bb.num_kv_heads, bb.head_dim, dtype=dtype, device="cpu",
                             backend="triton")
        warmup._warm_attention(cache, torch.float32, limits)
        assert len(seen) == len(shared)
        for k_scale, v_scale in seen:
            if cache.quantized:
                assert k_scale.data_ptr() == cache.kv_scales[0, 0:1].data_ptr()
                assert v_scale.data_ptr() == cache.kv_scales[0, 1:2].data_ptr()
            else:
                assert k_scale is None and v_scale is None
