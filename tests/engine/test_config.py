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


@pytest.mark.parametrize("bad", [-1, 1, 63, 64.0, True, None])
def test_mixed_graph_tokens_is_zero_or_at_least_the_smallest_bucket(bad):
    with pytest.raises(ValueError, match=r"mixed_graph_tokens must be 0 \(off\) or an int >= 64 .* got"):
        EngineConfig(variant="turbo", mixed_graph_tokens=bad)


@pytest.mark.parametrize("good", [0, 64, 65, 4096])
def test_mixed_graph_tokens_takes_zero_and_counts_from_the_smallest_bucket(good):
    assert EngineConfig(variant="turbo", mixed_graph_tokens=good).mixed_graph_tokens == good


def test_mixed_graph_tokens_is_a_flat_engine_option():
    assert EngineConfig.from_flat(variant="turbo", mixed_graph_tokens=0).mixed_graph_tokens == 0
