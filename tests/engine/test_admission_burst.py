"""Admitting a burst of requests together (``T3Engine.add_requests``, and the engine thread
admitting every admission command it drained at once): each request as ``add_request`` would
admit it, their prompt embeddings made in one batch."""
from __future__ import annotations

import threading

import pytest
import torch

from chorus.engine.async_engine import AsyncT3Engine
from chorus.engine.engine import Conditioning, T3Request
from chorus.engine.scheduler import AdmissionError
from tests.engine.test_engine_parity import _engine, _requests, _sequential
from tests.engine.tiny_models import tiny


def _run(engine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for event in engine.step():
            if event.new_token is not None:
                tokens.setdefault(event.request_id, []).append(event.new_token)
    return tokens


def _count_batches(monkeypatch, model) -> list[int]:
    """The sizes of the prompt-embedding batches the model is asked for."""
    sizes: list[int] = []
    original = model.prefill_embeds_many

    def counted(requests):
        sizes.append(len(requests))
        return original(requests)

    monkeypatch.setattr(model, "prefill_embeds_many", counted)
    return sizes


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_a_burst_is_admitted_in_one_embedding_batch_and_decodes_as_each_alone(name, monkeypatch):
    variant, model = tiny(name)
    engine = _engine(variant, model, budget=96)
    requests = _requests(variant, 6, seed=3)
    for i, request in enumerate(requests):
        request.request_id = f"r{i}"
    sizes = _count_batches(monkeypatch, model)
    assert engine.add_requests(requests) == [f"r{i}" for i in range(6)]
    assert sizes == [6]  # not one per request
    tokens = _run(engine)
    for request in requests:
        assert tokens[request.request_id] == _sequential(variant, model, request), request.request_id


def test_a_refused_request_of_a_burst_leaves_no_trace_and_keeps_no_one_else_out(monkeypatch):
    variant, model = tiny("original")
    engine = _engine(variant, model, max_model_len=4096)
    good = _requests(variant, 3, seed=4, max_tokens=6)
    for i, request in enumerate(good):
        request.request_id = f"good-{i}"
    too_long = T3Request([5] * (variant.t3.text_pos_rows + 1), good[0].conditioning, good[0].params,
                         request_id="too-long")  # refused before its embeddings are made
    bad_text = T3Request([], good[0].conditioning, good[0].params, request_id="empty")
    twin = T3Request(good[1].text_ids, good[1].conditioning, good[1].params, request_id="good-1")
    sizes = _count_batches(monkeypatch, model)
    outcomes = engine.add_requests([good[0], too_long, good[1], bad_text, twin, good[2]])
    assert outcomes[0] == "good-0" and outcomes[2] == "good-1" and outcomes[5] == "good-2"
    assert isinstance(outcomes[1], AdmissionError) and "exceed the model's" in str(outcomes[1])
    assert isinstance(outcomes[3], ValueError) and "no text tokens" in str(outcomes[3])
    assert isinstance(outcomes[4], ValueError) and "already in the engine" in str(outcomes[4])
    assert sorted(engine.runner.requests) == ["good-0", "good-1", "good-2"]
    assert sizes[0] == 3  # one per id among those that passed the checks (the twin shares good-1's)
    tokens = _run(engine)
    for request in good:
        assert tokens[request.request_id] == _sequential(variant, model, request)
    # nothing made ahead was kept: a later request of a used id makes its own embeddings
    assert engine.add_requests([twin]) == ["good-1"] and sizes[-1] == 1


def test_a_burst_whose_batch_cannot_be_made_admits_each_on_its_own(monkeypatch):
    """A request whose conditioning has the wrong width passes the checks but breaks the
    batch; every request then makes its own embeddings, so only that one is refused."""
    variant, model = tiny("turbo")
    engine = _engine(variant, model)
    requests = _requests(variant, 3, seed=5, max_tokens=4)
    for i, request in enumerate(requests):
        request.request_id = f"r{i}"
    cond = requests[1].conditioning
    requests[1].conditioning = Conditioning(cond.key + b"-wide", torch.cat([cond.embeds, cond.embeds[..., :1]], dim=-1))
    sizes = _count_batches(monkeypatch, model)
    outcomes = engine.add_requests(requests)
    assert sizes == [3, 1, 1, 1]  # the batch, then each alone
    assert outcomes[0] == "r0" and outcomes[2] == "r2" and isinstance(outcomes[1], RuntimeError)
    assert sorted(engine.runner.requests) == ["r0", "r2"]
    tokens = _run(engine)
    for request in (requests[0], requests[2]):
        assert tokens[request.request_id] == _sequential(variant, model, request)


def test_the_engine_thread_admits_what_it_drained_as_one_burst(monkeypatch):
    """Submissions queued before the thread looks are admitted in one embedding batch; a
    stream()'s refused request gets its exception and the submitted ones run on."""
    variant, model = tiny("turbo")
    engine = _engine(variant, model)
    outputs, done = [], threading.Event()

    def on_step(events):
        outputs.extend(events)
        if sum(1 for e in outputs if e.finish_reason is not None) == 4:
            done.set()

    runner = AsyncT3Engine(engine, on_step=on_step)
    requests = _requests(variant, 4, seed=6, max_tokens=5)
    for i, request in enumerate(requests):
        request.request_id = f"s{i}"
    sizes = _count_batches(monkeypatch, model)
    runner.submit(requests[:2])
    runner.submit(requests[2:])
    runner.start()
    try:
        assert done.wait(60), "the burst did not finish"
    finally:
        runner.stop()
    assert sizes[0] == 4
    tokens: dict[str, list[int]] = {}
    for event in outputs:
        if event.new_token is not None:
            tokens.setdefault(event.request_id, []).append(event.new_token)
    for request in requests:
        assert tokens[request.request_id] == _sequential(variant, model, request)
