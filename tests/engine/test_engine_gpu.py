"""GPU-only engine paths against their CPU/eager references (run on a CUDA machine)."""
from __future__ import annotations

import gc

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.models.random_checkpoint import random_builtin_voice, random_state_dict, t3_key_specs
from chorus.models.t3.model import T3Model
from chorus.models.variants import get_variant
from chorus.sampling import SamplingParams
from chorus.t3_sequential import generate_speech_tokens
from chorus.pipeline.conditioning import ConditioningCache
from chorus.voices import Voice

pytestmark = pytest.mark.gpu


def _model(name, dtype):
    variant = get_variant(name)
    state = random_state_dict(t3_key_specs(variant), seed=0)
    state["speech_head.weight"] = state["speech_head.weight"] * 8
    return variant, T3Model.from_state_dict(variant.t3, state, dtype=dtype, device="cuda", source="random")


def _engine(model, variant, graphs, *, mixed_graph_tokens=256, admit_within_graphs=True, **scheduler):
    config = EngineConfig(variant=variant.name, default_deadline_s=None, mixed_graph_tokens=mixed_graph_tokens,
                          admit_within_graphs=admit_within_graphs,
                          cache=CacheConfig(kv_cache_bytes=4 << 30),
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=1024,
                                                    **scheduler))
    return T3Engine(model, variant, config, cuda_graphs=graphs)


def _requests(variant, model, n, tokens=24):
    voice = Voice.from_conditionals(random_builtin_voice(variant, 0))
    cond = ConditioningCache(model, variant).get(voice, 0.5)
    g = torch.Generator().manual_seed(0)
    reqs = []
    for i in range(n):
        text = torch.randint(1, 600, (int(torch.randint(5, 60, (1,), generator=g)),), generator=g).tolist()
        cfg = 0.5 if variant.t3.supports_cfg else None
        reqs.append(T3Request(text, cond, SamplingParams.for_variant(variant, seed=i, max_new_tokens=tokens,
                                                                          cfg_weight=cfg)))
    return reqs


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_cuda_graph_decode_equals_eager(name):
    variant, model = _model(name, torch.float32)
    reqs = _requests(variant, model, 5)
    graph = _engine(model, variant, True)
    assert graph.runner.graphs is not None
    eager = _engine(model, variant, False)
    got_graph = [r.tokens for r in graph.generate(reqs)]
    got_eager = [r.tokens for r in eager.generate(reqs)]
    assert got_graph == got_eager


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_lookahead_on_gpu_gives_the_tokens_of_synchronous_steps(name):
    """bf16, CUDA graphs and sampler graphs: the step ahead reads its input tokens on the
    device; with the same batch compositions (no early stops) every token is the same."""
    import dataclasses

    variant, model = _model(name, torch.bfloat16)
    reqs = _requests(variant, model, 6, tokens=40)
    for r in reqs:
        r.params = dataclasses.replace(r.params, ignore_eos=True)
    runs = []
    for lookahead in (False, True):
        engine = _engine(model, variant, True)
        engine.config = dataclasses.replace(
            engine.config, scheduler=dataclasses.replace(engine.config.scheduler, async_scheduling=lookahead))
        runs.append([r.tokens for r in engine.generate(reqs)])
        assert (engine.num_steps_ahead > 0) == lookahead
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_arrivals_admitted_ahead_on_gpu_equal_the_sequential_path(name):
    """fp32, CUDA graphs and sampler graphs (``SchedulerConfig.admit_ahead``): a request that
    arrives while others decode is admitted in a step queued behind the replayed graph in
    flight, itself replayed from a mixed graph (its prompt is the voice's cached prefix and its
    text), and gets the sequential path's tokens."""
    import dataclasses

    from tests.engine.test_admit_ahead import _staggered

    variant, model = _model(name, torch.float32)
    reqs = _requests(variant, model, 5)
    for r in reqs:
        r.params = dataclasses.replace(r.params, ignore_eos=True)
    engine = _engine(model, variant, True, admit_ahead=True)
    got = _staggered(engine, reqs)
    assert engine.num_steps - engine.num_steps_ahead == 1  # every later arrival went ahead
    assert engine.runner.graphs.replays["mixed"] >= len(reqs) - 1
    for req, tokens in zip(reqs, got):
        seq = generate_speech_tokens(model, variant, req.conditioning.embeds, torch.tensor(req.text_ids), req.params).tokens
        assert tokens == seq


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_mixed_step_graphs_give_the_tokens_of_eager_mixed_steps(name):
    """fp32: staggered arrivals admitted beside decode rows, once replayed from mixed graphs and
    once run eagerly (``mixed_graph_tokens=0``), give the same tokens; a step that admits more
    prompt rows than a mixed graph takes (the first, a burst) runs eagerly in both."""
    import dataclasses

    from chorus.engine.cuda_graphs import MIXED_PROMPT_ROWS

    variant, model = _model(name, torch.float32)
    reqs = _requests(variant, model, 14, tokens=30)
    for r in reqs:
        r.params = dataclasses.replace(r.params, ignore_eos=True)
    runs, replays = [], []
    for tokens in (256, 0):
        engine = _engine(model, variant, True, mixed_graph_tokens=tokens, admit_ahead=True)
        ids = [engine.add_request(r) for r in reqs[:MIXED_PROMPT_ROWS + 1]]  # the burst
        waiting, by_id, steps = list(reqs[MIXED_PROMPT_ROWS + 1:]), {}, 0
        while waiting or engine.has_unfinished_requests():
            if waiting and steps % 2 == 1:
                ids.append(engine.add_request(waiting.pop(0)))
            for out in engine.step():
                if out.new_token is not None:
                    by_id.setdefault(out.request_id, []).append(out.new_token)
            steps += 1
        runs.append([by_id.get(i, []) for i in ids])
        replays.append(dict(engine.runner.graphs.replays))
    assert runs[0] == runs[1]
    assert replays[0]["mixed"] >= len(reqs) - MIXED_PROMPT_ROWS - 1 and replays[1]["mixed"] == 0


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_a_burst_beside_decode_rows_is_admitted_through_mixed_graphs(name):
    """fp32: 12 arrivals at once while two requests decode. With ``admit_within_graphs`` (the
    default) a step that decodes admits what the largest mixed graph holds, so every step that
    computes prompt positions after the first (two prompts, nothing decoding: eager where its
    prompts are longer than the largest graph) replays a graph; without it the burst is admitted
    in one eager step. The tokens are the same."""
    import dataclasses

    variant, model = _model(name, torch.float32)
    reqs = _requests(variant, model, 14, tokens=30)
    for r in reqs:
        r.params = dataclasses.replace(r.params, ignore_eos=True)
    runs, eager = [], []
    for within in (True, False):
        engine = _engine(model, variant, True, admit_within_graphs=within, admit_ahead=True)
        ids = [engine.add_request(r) for r in reqs[:2]]
        by_id, prefilled, steps = {}, 0, 0
        while engine.has_unfinished_requests():
            if steps == 3:
                ids += [engine.add_request(r) for r in reqs[2:]]  # the burst, beside two decoding
            for out in engine.step():
                if out.new_token is not None:
                    by_id.setdefault(out.request_id, []).append(out.new_token)
            prefilled += engine.last_step_prefilled
            steps += 1
        runs.append([by_id.get(i, []) for i in ids])
        eager.append(prefilled - engine.runner.graphs.replays["mixed"])
    assert runs[0] == runs[1] and all(len(tokens) == 30 for tokens in runs[0])
    # the first step (no decode rows, the voice prefix not yet cached) runs eagerly where no graph holds it
    assert eager[0] <= 1 and eager[1] == eager[0] + 1


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_engine_on_gpu_equals_sequential_path(name):
    """Triton paged attention + CUDA graphs vs the contiguous-cache SDPA path, fp32."""
    variant, model = _model(name, torch.float32)
    reqs = _requests(variant, model, 4)
    results = _engine(model, variant, True).generate(reqs)
    for req, res in zip(reqs, results):
        seq = generate_speech_tokens(model, variant, req.conditioning.embeds, torch.tensor(req.text_ids), req.params).tokens
        assert res.tokens == seq


@pytest.mark.parametrize("name", ["original", "turbo", "nano"])
def test_bf16_logits_match_fp32(name):
    _, m32 = _model(name, torch.float32)
    variant, m16 = _model(name, torch.bfloat16)
    voice = Voice.from_conditionals(random_builtin_voice(variant, 0))
    text = torch.arange(10, 40)
    logits = []
    for m in (m32, m16):
        cond = m.encode_conditioning(voice.speaker_embedding, voice.t3_prompt_tokens, 0.5)
        embeds = m.prefill_embeds(cond, text, cfg=False)[0]
        cache = m.new_contiguous_cache(1, embeds.shape[0] + 1)
        pos = cache.begin_step(embeds.shape[0])
        with torch.inference_mode():
            logits.append(m.speech_logits(m(embeds, pos, cache)[-1]).float())
    cos = torch.nn.functional.cosine_similarity(logits[0], logits[1], dim=0).item()
    assert cos >= 0.999, cos


def test_pool_is_sized_by_profiling_when_no_budget_is_given():
    variant, model = _model("turbo", torch.bfloat16)
    config = EngineConfig(variant=variant.name, default_deadline_s=None,
                          cache=CacheConfig(gpu_memory_utilization=0.5),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=1024))
    engine = T3Engine(model, variant, config, cuda_graphs=False)
    free, total = torch.cuda.mem_get_info()
    pool_bytes = engine.kv_cache.kv.numel() * engine.kv_cache.kv.element_size()
    assert 0.2 * total < pool_bytes < 0.5 * total
    results = engine.generate(_requests(variant, model, 2, tokens=8))
    assert all(len(r.tokens) == 8 for r in results)


def test_memory_that_graphs_captured_before_hold_is_left_out_of_the_pool():
    # e.g. the vocoder's warm-up graphs, captured before the engine at server start: their private
    # pool keeps the intermediates' memory, which empty_cache cannot return and replays need
    variant, model = _model("turbo", torch.bfloat16)
    config = EngineConfig(variant=variant.name, default_deadline_s=None,
                          cache=CacheConfig(gpu_memory_utilization=0.5),
                          scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=1024))

    def pool_bytes() -> int:
        engine = T3Engine(model, variant, config, cuda_graphs=False)
        size = engine.kv_cache.kv.numel() * engine.kv_cache.kv.element_size()
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        return size

    def held_by_graphs() -> int:  # earlier tests of this process may have left graphs of their own
        return torch.cuda.memory_reserved() - torch.cuda.memory_allocated()

    alone = pool_bytes()
    held_before = held_by_graphs()
    graph, x = torch.cuda.CUDAGraph(), torch.zeros(1, device="cuda")
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        scratch = torch.ones(256 << 20, device="cuda")  # 1 GiB, freed inside the capture
        y = x + scratch.sum()
        del scratch
    torch.cuda.empty_cache()
    held = held_by_graphs() - held_before
    assert held >= 1 << 30
    assert alone - pool_bytes() == pytest.approx(held, abs=64 << 20)
    del graph, y


def test_graphs_are_captured_while_another_thread_keeps_using_the_gpu():
    """A model version loading beside one that serves: the serving version's threads allocate,
    free cached memory and synchronise the device (as the package does, through the capture gate)
    while the new engine captures its graphs; neither side may fail."""
    import threading

    from chorus import capture_gate

    variant, model = _model("turbo", torch.float32)
    stop, errors, rounds = threading.Event(), [], [0]

    def serving():
        x = torch.randn(256, 256, device="cuda")
        while not stop.is_set():
            try:
                x = torch.tanh(x @ x.T / 256) + torch.empty(1 << 16, device="cuda").fill_(0)[:1]
                capture_gate.synchronize()
                if rounds[0] % 16 == 0:
                    capture_gate.empty_cache()
                rounds[0] += 1
            except Exception as exc:  # noqa: BLE001 - what the test asserts on
                errors.append(exc)
                return

    thread = threading.Thread(target=serving)
    thread.start()
    try:
        engine = _engine(model, variant, True)
    finally:
        stop.set()
        thread.join()
    assert not errors and rounds[0] > 0
    assert engine.runner.graphs is not None
    reqs = _requests(variant, model, 3)
    assert [r.tokens for r in engine.generate(reqs)] == [r.tokens for r in _engine(model, variant, False).generate(reqs)]
