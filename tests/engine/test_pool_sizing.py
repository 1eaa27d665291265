"""The KV pool's size on the CPU, where host memory is not profiled: the default budget, or one
longest request when that is more (the original's CFG pair in fp32 needs about 2 GiB at 4096
positions, over the 1 GiB default)."""
from __future__ import annotations

import torch

import chorus.engine.engine as engine_module
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine
from chorus.engine.paged_cache import kv_bytes_per_block
from tests.engine.tiny_models import tiny


def _cpu_engine(name: str, max_model_len: int) -> T3Engine:
    variant, model = tiny(name)
    config = EngineConfig(variant=variant.name, default_deadline_s=None, cache=CacheConfig(block_size=16),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=max_model_len,
                                                    max_model_len=max_model_len))
    return T3Engine(model, variant, config)


def test_a_cpu_pool_whose_default_budget_is_short_of_one_request_holds_one_cfg_pair(monkeypatch):
    monkeypatch.setattr(engine_module, "DEFAULT_CPU_KV_BYTES", 1)  # less than any block
    engine = _cpu_engine("original", max_model_len=512)
    assert engine.kv_cache.num_blocks == 2 * 512 // 16  # the request's two CFG rows


def test_a_cpu_pool_keeps_the_default_budget_when_it_holds_more(monkeypatch):
    default_blocks = 100
    bb = tiny("turbo")[0].t3.backbone
    per_block = kv_bytes_per_block(bb.num_layers, 16, bb.num_kv_heads, bb.head_dim, torch.float32)
    monkeypatch.setattr(engine_module, "DEFAULT_CPU_KV_BYTES", default_blocks * per_block)
    assert _cpu_engine("turbo", max_model_len=64).kv_cache.num_blocks == default_blocks
