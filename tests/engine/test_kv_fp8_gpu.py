"""The FP8 KV cache on a GPU: its accuracy cost on random-weight models (tiny and full-size
original, bf16), and the engine on it (CUDA graphs against eager, with and without shared-prefix
plans, pool sizing)."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.kv_accuracy import measure_kv_accuracy
from chorus.models.random_checkpoint import random_builtin_voice, random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import get_variant, tiny_variant
from chorus.pipeline.conditioning import ConditioningCache
from chorus.sampling import SamplingParams
from chorus.voices import Voice
from tests.engine.shared_prefix_runs import generate_after_the_first
from tests.engine.test_engine_gpu import _requests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="FP8 conversions need compute capability 8.9+"),
]

LOGITS_COSINE_FLOOR = 0.99


def _model(variant, dtype=torch.bfloat16):
    state = random_state_dict(t3_key_specs(variant), seed=0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8
    return T3Model.from_state_dict(variant.t3, state, dtype=dtype, device="cuda", source="random")


def _real_prompt(variant, model):
    """A request's conditional row: the random built-in voice, 40 text tokens, BOS."""
    cond = ConditioningCache(model, variant).get(Voice.from_conditionals(random_builtin_voice(variant, 0)), 0.5)
    text = torch.randint(1, 600, (40,), generator=torch.Generator().manual_seed(0))
    return model.prefill_embeds(cond.embeds, text, cfg=False)[0]


@pytest.mark.parametrize("size", ["tiny", "full"])
@pytest.mark.parametrize("name", ["original", "turbo"])
def test_fp8_logits_stay_close_to_the_bf16_cache(name, size, capsys):
    variant = tiny_variant(name, layers=2, hidden=64, heads=4) if size == "tiny" else get_variant(name)
    model = _model(variant)
    lines = []
    for prompt_name, prompt in (("synthetic", None), ("voice+text", _real_prompt(variant, model))):
        for rule in ("calibrated", "unit"):
            result = measure_kv_accuracy(model, prompt, scale_rule=rule, decode_steps=16)
            lines.append(f"{name} {size} {prompt_name:10s} {rule:10s} logits cosine min {result.min_cosine:.6f} "
                         f"mean {result.mean_cosine:.6f} top-1 agreement {result.top1_agreement:.2f}")
            if rule == "calibrated":  # the engine's rule
                assert result.min_cosine >= LOGITS_COSINE_FLOOR, lines[-1]
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def _engine(model, variant, kv_cache_dtype, graphs):
    # admit_within_graphs off: the graphed engine then admits in the eager one's batch compositions,
    # which the comparisons need (shared-prefix plans and KV splits follow the composition)
    config = EngineConfig(variant=variant.name, default_deadline_s=None, admit_within_graphs=False,
                          cache=CacheConfig(kv_cache_bytes=2 << 30, kv_cache_dtype=kv_cache_dtype),
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=1024))
    return T3Engine(model, variant, config, cuda_graphs=graphs)


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_fp8_cuda_graph_decode_equals_eager(name, capsys):
    """fp32 model (so only the FP8 storage rounds): a graph replay and the eager step split the
    KV differently, which bf16 activations would turn into different tokens. Six requests
    admitted together form no shared-prefix group (see the test below)."""
    variant = get_variant(name)
    model = _model(variant, torch.float32)
    reqs = _requests(variant, model, 6, tokens=24)
    eager = _engine(model, variant, "fp8_e4m3", graphs=False).generate(reqs)
    graphed_engine = _engine(model, variant, "fp8_e4m3", graphs=True)
    assert graphed_engine.runner.graphs is not None
    graphed = graphed_engine.generate(reqs)
    assert [r.tokens for r in graphed] == [r.tokens for r in eager]
    bf16 = _engine(model, variant, "auto", graphs=True).generate(reqs)
    same = sum(next((i for i, (a, b) in enumerate(zip(x.tokens, y.tokens)) if a != b), len(x.tokens))
               for x, y in zip(bf16, graphed))
    with capsys.disabled():
        print(f"\n{name}: fp8 tokens equal to bf16's before the first difference: "
              f"{same}/{sum(len(r.tokens) for r in bf16)}")


def test_fp8_shared_prefix_graphs_equal_eager():
    """An FP8 pool keeps shared-prefix attention: 40 turbo requests of one voice decode with
    plans (graph replays of the shared buckets, and eagerly), and the tokens agree (fp32 model)."""
    variant = get_variant("turbo")
    model = _model(variant, torch.float32)
    cond = ConditioningCache(model, variant).get(Voice.from_conditionals(random_builtin_voice(variant, 0)), 0.5)
    gen = torch.Generator().manual_seed(1)
    reqs = [T3Request(torch.randint(1, 600, (5 + (7 * i) % 50,), generator=gen).tolist(), cond,
                      SamplingParams.for_variant(variant, seed=i, max_new_tokens=24, ignore_eos=True))
            for i in range(40)]  # all run 24 steps: the batch stays above the planning threshold
    runs = []
    for graphs in (False, True):
        engine = _engine(model, variant, "fp8_e4m3", graphs=graphs)
        assert engine.runner.shared_prefix
        if graphs:
            assert engine.runner.graphs.shared_buckets
        tokens, planned = generate_after_the_first(engine, reqs)
        assert sum(planned) >= len(planned) // 2, planned
        runs.append(tokens)
    assert runs[1] == runs[0]


def test_a_byte_budget_buys_twice_the_bf16_blocks():
    variant = get_variant("turbo")
    model = _model(variant)
    bf16 = _engine(model, variant, "auto", graphs=False)
    fp8 = _engine(model, variant, "fp8_e4m3", graphs=False)
    # budget // bytes_per_block: half the bytes per block, twice the blocks (one more where
    # the bf16 division left at least half a block over)
    assert fp8.kv_cache.num_blocks in (2 * bf16.kv_cache.num_blocks, 2 * bf16.kv_cache.num_blocks + 1)
    assert fp8.kv_cache.kv.element_size() == 1
