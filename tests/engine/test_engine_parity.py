"""The engine's tokens equal Chorus's own single-sequence path (``chorus.t3_sequential``), token
for token. That path, not the reference package, is what these tests compare with; the model's
and the sampler's parity with the reference are tested in tests/models/t3/ (logits) and
tests/sampling/ (probabilities)."""
from __future__ import annotations

import math

import pytest
import torch

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.request import FinishReason, Priority
from chorus.sampling import SamplingParams
from chorus.t3_sequential import generate_speech_tokens
from chorus.engine.scheduler import AdmissionError
from tests.engine.tiny_models import conditioning, tiny, voice

VARIANTS = ["original", "multilingual", "turbo", "nano"]


def _sequential(variant, model, req: T3Request) -> list[int]:
    cond = req.conditioning.embeds
    return generate_speech_tokens(model, variant, cond, torch.tensor(req.text_ids), req.params).tokens


def _model_of(variant):
    return tiny(variant.name.removeprefix("tiny-"))[1]


def _engine(variant, model, *, num_blocks=None, max_num_seqs=64, budget=512, prefix=True, max_model_len=1024,
            kv_cache_dtype="auto", step_time_target_s=None):
    config = EngineConfig(
        variant=variant.name, default_deadline_s=None,
        cache=CacheConfig(block_size=16, num_blocks=num_blocks, kv_cache_bytes=64 << 20,
                          enable_prefix_caching=prefix, kv_cache_dtype=kv_cache_dtype),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                  max_model_len=max_model_len, step_time_target_s=step_time_target_s),
    )
    return T3Engine(model, variant, config)


def _requests(variant, n, *, seed=0, max_tokens=24, same_voice=False, exaggerations=(0.5, 0.8, 0.3),
              **overrides):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        text = torch.randint(1, min(variant.t3.text_vocab_size, 600), (length,), generator=g).tolist()
        cfg = [0.3, 0.5, 1.0][i % 3] if variant.t3.supports_cfg else None
        params = SamplingParams.for_variant(variant, seed=1000 + i, max_new_tokens=max_tokens,
                                            cfg_weight=cfg, **overrides)
        cond = conditioning(variant, _model_of(variant), voice(variant, 0 if same_voice else i),
                            exaggerations[i % len(exaggerations)])
        out.append(T3Request(text, cond, params, priority=i % 3))
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_engine_alone_equals_sequential(name):
    variant, model = tiny(name)
    req = _requests(variant, 1)[0]
    got = _engine(variant, model).generate([req])[0]
    assert got.tokens == _sequential(variant, model, req)


@pytest.mark.parametrize("name", VARIANTS)
def test_mixed_batch_equals_sequential(name):
    """Mixed text lengths, cfg weights, exaggerations and priorities in one batch."""
    variant, model = tiny(name)
    reqs = _requests(variant, 6, seed=1)
    results = _engine(variant, model, budget=96).generate(reqs)  # small budget: chunked prefill
    for req, res in zip(reqs, results):
        assert res.tokens == _sequential(variant, model, req), res.request_id


def test_prefix_hits_do_not_change_tokens():
    variant, model = tiny("original")
    reqs = _requests(variant, 4, seed=2, same_voice=True, exaggerations=(0.5,))
    engine = _engine(variant, model)
    first = engine.generate(reqs[:1])
    rest = engine.generate(reqs[1:])
    assert engine.kv_manager.metrics().prefix_hit_rate > 0
    for req, res in zip(reqs, first + rest):
        assert res.tokens == _sequential(variant, model, req)


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_preemption_by_recompute_keeps_tokens(name):
    variant, model = tiny(name)
    reqs = _requests(variant, 6, seed=3, max_tokens=40, ignore_eos=True)
    blocks, max_len = (24, 128) if name == "original" else (80, 512)
    engine = _engine(variant, model, num_blocks=blocks, max_model_len=max_len)
    results = engine.generate(reqs)
    assert engine.scheduler.num_preemptions > 0
    for req, res in zip(reqs, results):
        assert res.tokens == _sequential(variant, model, req)
    assert engine.kv_manager.num_free_blocks == blocks


def test_abort_frees_blocks_and_stops_request():
    variant, model = tiny("original")
    reqs = _requests(variant, 3, seed=4, max_tokens=50, ignore_eos=True)
    engine = _engine(variant, model)
    ids = [engine.add_request(r) for r in reqs]
    for _ in range(5):
        engine.step()
    out = engine.abort(ids[1])
    assert out.finish_reason is FinishReason.ABORTED
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_manager.num_free_blocks == engine.kv_cache.num_blocks
    assert ids[1] not in engine.runner.requests


def test_min_tokens_and_ignore_eos_are_respected():
    variant, model = tiny("turbo")
    reqs = _requests(variant, 2, seed=5, max_tokens=30, ignore_eos=True)
    results = _engine(variant, model).generate(reqs)
    assert all(len(r.tokens) == 30 and r.finish_reason is FinishReason.LENGTH for r in results)


def test_priorities_order_admission_under_row_limit():
    variant, model = tiny("turbo")
    reqs = _requests(variant, 3, seed=6, max_tokens=8, ignore_eos=True)
    reqs[0].priority, reqs[1].priority, reqs[2].priority = Priority.LOW, Priority.NORMAL, Priority.HIGH
    engine = _engine(variant, model, max_num_seqs=1)
    ids = [engine.add_request(r) for r in reqs]
    finished = []
    while engine.has_unfinished_requests():
        finished += [e.request_id for e in engine.step() if e.finish_reason is not None]
    assert finished == [ids[2], ids[1], ids[0]]


def test_text_is_framed_exactly_once(tmp_path):
    from chorus.models.random_checkpoint import write_random_checkpoint
    from chorus.text import load_text_encoder

    variant, model = tiny("original")
    write_random_checkpoint(variant, tmp_path, components=("tokenizer",))
    encoder = load_text_encoder(variant, tmp_path)
    engine = _engine(variant, model)
    params = SamplingParams.for_variant(variant, max_new_tokens=10)
    rid = engine.add_request(T3Request(encoder.encode("Hi."), conditioning(variant, model, voice(variant, 0)), params))
    framed = engine.scheduler.get_request(rid).prompt.text_ids
    assert list(framed) == encoder.encode_framed("Hi.")
    assert framed.count(variant.t3.start_text_token) == 1


def test_a_text_longer_than_the_position_table_is_rejected_at_admission():
    """Admission is atomic: the rejected request leaves nothing behind and the batch it would
    have joined runs on unharmed."""
    variant, model = tiny("original")
    engine = _engine(variant, model, max_model_len=4096)
    good = _requests(variant, 1, max_tokens=6)[0]
    good_id = engine.add_request(good)
    tokens = [e.new_token for e in engine.step() if e.new_token is not None]
    too_long = T3Request([5] * (variant.t3.text_pos_rows + 1), good.conditioning, good.params,
                         request_id="too-long")
    with pytest.raises(AdmissionError, match="exceed the model's"):
        engine.add_request(too_long)
    assert engine.scheduler.get_request("too-long") is None and "too-long" not in engine.runner.requests
    while engine.has_unfinished_requests():
        for event in engine.step():
            assert event.request_id == good_id and event.finish_reason is not FinishReason.ERROR
            if event.new_token is not None:
                tokens.append(event.new_token)
    assert tokens == _sequential(variant, model, good)


def test_a_request_the_runner_rejects_is_not_queued(monkeypatch):
    variant, model = tiny("turbo")
    engine = _engine(variant, model)
    req = _requests(variant, 1)[0]

    def broken(*args, **kwargs):
        raise ValueError("bad prompt")

    monkeypatch.setattr(engine.runner, "add_request", broken)
    with pytest.raises(ValueError, match="bad prompt"):
        engine.add_request(req)
    assert not engine.has_unfinished_requests()


def test_a_failed_step_fails_its_requests_and_frees_their_blocks(monkeypatch):
    variant, model = tiny("turbo")
    engine = _engine(variant, model, step_time_target_s=math.inf)  # both prompts in the first step
    ids = [engine.add_request(r) for r in _requests(variant, 2, max_tokens=5)]

    def broken(out, pending=None):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.runner, "launch", broken)
    results = engine.step()
    assert {r.request_id for r in results} == set(ids)
    assert all(r.finish_reason is FinishReason.ERROR and "device lost" in r.error for r in results)
    assert not engine.has_unfinished_requests() and not engine.runner.requests
    assert engine.kv_manager.num_free_blocks == engine.kv_cache.num_blocks
