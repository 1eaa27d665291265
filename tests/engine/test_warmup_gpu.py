"""After the engine's kernel warm-up, a mixed workload compiles no new Triton variant (GPU only).

Each Triton ``JITFunction`` keeps its compiled variants per device in ``device_caches[device][0]``
(Triton 3.6: a dict from specialisation key to kernel). The test counts them right after the
engine is built (graph capture and warm-up done), runs a workload that mixes prefill chunks of
several lengths with decode rows (several voices, prefix hits, shared-prefix groups in eager
mixed steps, requests ending at different steps), and asserts no count grew.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.request import FinishReason
from chorus.models.random_checkpoint import random_builtin_voice, random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import tiny_variant
from chorus.pipeline.conditioning import ConditioningCache
from chorus.sampling import SamplingParams
from chorus.voices import Voice

pytestmark = pytest.mark.gpu

# every module holding a Triton kernel an engine step can launch (docs/engine.md, "Kernel
# variants and warm-up")
KERNEL_MODULES = (
    "chorus.engine.attention.triton_paged",
    "chorus.engine.attention.triton_paged_kernel",
    "chorus.engine.attention.triton_shared_prefix",
    "chorus.models.t3.triton_ops",
    "chorus.sampling.triton_sampler",
)


def _jit_functions() -> dict:
    from triton.runtime.jit import JITFunction

    found = {}
    for name in KERNEL_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, JITFunction):
                found[f"{value.module}.{value.fn.__name__}"] = value
    assert any(k.endswith("._paged_attention_kernel") for k in found), sorted(found)
    return found


def _variant_counts() -> dict[str, int]:
    counts = {}
    for name, fn in _jit_functions().items():
        assert hasattr(fn, "device_caches"), "this Triton keeps its compiled kernels elsewhere (not 3.6?)"
        counts[name] = sum(len(caches[0]) for caches in fn.device_caches.values())
    return counts


def _model(name: str):
    variant = tiny_variant(name, layers=2, hidden=128, heads=2)  # head_dim 64, as the real models
    state = random_state_dict(t3_key_specs(variant), seed=0)
    return variant, T3Model.from_state_dict(variant.t3, state, dtype=torch.bfloat16, device="cuda", source="random")


def _engine(variant, model, kv_cache_dtype: str, warm_up: bool = True) -> T3Engine:
    config = EngineConfig(
        variant=variant.name, default_deadline_s=None, warm_up_kernels=warm_up,
        cache=CacheConfig(kv_cache_bytes=1 << 30, kv_cache_dtype=kv_cache_dtype),
        scheduler=SchedulerConfig(max_num_seqs=96, max_num_batched_tokens=384, max_model_len=1024))
    return T3Engine(model, variant, config)


class _Workload:
    """Requests in three waves: one of voice 0 (its prefix gets cached), 35 more of voice 0 once
    it decodes (prefix hits: decode rows sharing blocks), then 12 of voices 1 and 2 with long and
    short texts while those decode (mixed prefill/decode steps, some with shared-prefix groups).
    Fixed output lengths from 30 to 129 tokens, so requests end at different steps."""

    def __init__(self, variant, model):
        self.variant = variant
        cache = ConditioningCache(model, variant)
        self.conds = [cache.get(Voice.from_conditionals(random_builtin_voice(variant, s), name=f"v{s}"), 0.5)
                      for s in range(3)]
        self.gen = torch.Generator().manual_seed(0)
        self.count = 0

    def request(self, voice: int, text_len: int) -> T3Request:
        vocab = min(self.variant.t3.text_vocab_size, 600)
        text = torch.randint(1, vocab, (text_len,), generator=self.gen).tolist()
        n = 30 + (self.count * 37) % 100
        cfg = 0.5 if self.variant.t3.supports_cfg else None
        params = SamplingParams.for_variant(self.variant, seed=self.count, max_new_tokens=n, min_new_tokens=n,
                                            cfg_weight=cfg)
        self.count += 1
        return T3Request(text, self.conds[voice], params)


def _run(engine: T3Engine, workload: _Workload) -> tuple[dict[str, list[int]], list[tuple]]:
    """Run the three waves; returns each request's tokens and, per prepared step, (decode rows,
    longest new span, whether a shared-prefix plan was used)."""
    steps = []
    prepare = engine.runner.prepare

    def recording_prepare(out, pending=None):
        inputs = prepare(out, pending)
        meta = inputs.metadata
        steps.append((meta.num_decodes, meta.max_query_len, meta.shared_prefix is not None))
        return inputs

    engine.runner.prepare = recording_prepare
    tokens: dict[str, list[int]] = {}
    finished: dict[str, FinishReason] = {}

    def add(req):
        tokens[engine.add_request(req)] = []

    def step_until(done):
        while engine.has_unfinished_requests() and not done():
            for event in engine.step():
                if event.new_token is not None:
                    tokens[event.request_id].append(event.new_token)
                if event.finish_reason is not None:
                    finished[event.request_id] = event.finish_reason

    add(workload.request(0, 24))
    step_until(lambda: all(tokens.values()))
    for i in range(35):
        add(workload.request(0, 5 + (i * 13) % 60))
    step_until(lambda: all(tokens.values()))
    for i in range(12):
        add(workload.request(1 + i % 2, [8, 40, 150, 300][i % 4] + i))
    step_until(lambda: False)
    assert len(finished) == len(tokens) and all(r is FinishReason.LENGTH for r in finished.values()), finished
    return tokens, steps


@pytest.mark.parametrize("name, kv_cache_dtype", [("original", "auto"), ("turbo", "auto"), ("original", "fp8_e4m3")])
def test_mixed_workload_compiles_nothing_after_the_warm_up(name, kv_cache_dtype, monkeypatch):
    import chorus.engine.model_runner as model_runner

    # shared-prefix plans in every step that has enough decode rows, however little they save,
    # so that the workload's mixed steps run the eager shared-prefix kernels too
    monkeypatch.setattr(model_runner, "SHARED_PREFIX_MIN_SAVED_TOKENS", 0)
    variant, model = _model(name)
    engine = _engine(variant, model, kv_cache_dtype)
    assert engine.warmup is not None and engine.warmup.attention_launches > 0
    before = _variant_counts()
    assert before["chorus.engine.attention.triton_paged_kernel._paged_attention_kernel"] > 0

    _, steps = _run(engine, _Workload(variant, model))

    after = _variant_counts()
    grown = {k: (before[k], after[k]) for k in after if after[k] != before[k]}
    assert not grown, f"compiled after the warm-up (before, after): {grown}"
    mixed = [s for s in steps if s[0] > 0 and s[1] > 1]
    assert mixed, "the workload never mixed prefill chunks with decode rows"
    assert len({s[1] for s in steps if s[1] > 1}) > 3, "too few prefill chunk lengths"
    assert any(s[2] for s in mixed), "no mixed step took the shared-prefix path"  # FP8 pools too


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_the_warm_up_changes_no_token(kv_cache_dtype):
    """Same requests, same steps, with and without the warm-up: it leaves the pool's contents
    and the captured graphs as they were."""
    variant, model = _model("original")
    runs = []
    for warm_up in (True, False):
        engine = _engine(variant, model, kv_cache_dtype, warm_up=warm_up)
        assert (engine.warmup is not None) == warm_up
        tokens, _ = _run(engine, _Workload(variant, model))
        runs.append(list(tokens.values()))
    assert runs[0] == runs[1]
