"""Engine configuration: the KV cache dtype option."""
import pytest

from chorus.engine.config import CacheConfig, EngineConfig


def test_kv_cache_dtype_defaults_to_the_model_dtype():
    assert CacheConfig().kv_cache_dtype == "auto"


def test_kv_cache_dtype_accepts_fp8_e4m3():
    assert CacheConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"


@pytest.mark.parametrize("bad", ["fp8", "bf16", "", None])
def test_an_unknown_kv_cache_dtype_names_the_choices(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8_e4m3"):
        CacheConfig(kv_cache_dtype=bad)


def test_kv_cache_dtype_is_a_flat_engine_option():
    config = EngineConfig.from_flat(variant="turbo", kv_cache_dtype="fp8_e4m3", block_size=32)
    assert config.cache.kv_cache_dtype == "fp8_e4m3" and config.cache.block_size == 32


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_mixed_graph_tokens_is_a_count_or_zero(bad):
    with pytest.raises(ValueError, match="mixed_graph_tokens must be an int >= 0"):
        EngineConfig(variant="turbo", mixed_graph_tokens=bad)


def test_mixed_graph_tokens_is_a_flat_engine_option():
    assert EngineConfig.from_flat(variant="turbo", mixed_graph_tokens=0).mixed_graph_tokens == 0
