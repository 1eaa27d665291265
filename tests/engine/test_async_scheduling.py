"""The one-step lookahead (``SchedulerConfig.async_scheduling``) changes when tokens reach the
host, never which tokens: every request gets the same tokens and finish reason as with
synchronous steps."""
from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from chorus.engine.request import FinishReason
from tests.engine.test_engine_parity import _engine, _requests
from tests.engine.tiny_models import tiny


def _run(variant, model, requests, *, lookahead: bool, **kw):
    engine = _engine(variant, model, **kw)
    engine.config = dataclasses.replace(
        engine.config, scheduler=dataclasses.replace(engine.config.scheduler, async_scheduling=lookahead))
    results = engine.generate(requests)
    engine.scheduler.check_invariants()
    assert engine.kv_manager.num_free_blocks == engine.kv_cache.num_blocks  # nothing leaked
    return [(r.tokens, r.finish_reason) for r in results], engine


def _mixed(variant, n=6):
    """Requests that end at different steps, by length and (some) by EOS."""
    reqs = _requests(variant, n, seed=11, max_tokens=40)
    for i, r in enumerate(reqs):
        r.params = dataclasses.replace(r.params, max_new_tokens=12 + 5 * i)
    return reqs


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_lookahead_gives_the_tokens_of_synchronous_steps(name):
    variant, model = tiny(name)
    reqs = _mixed(variant)
    want, _ = _run(variant, model, reqs, lookahead=False)
    got, engine = _run(variant, model, reqs, lookahead=True)
    assert got == want
    assert engine.num_steps_ahead > engine.num_steps // 2  # the steady steps went ahead


def test_a_request_stopping_on_eos_while_a_step_is_ahead_loses_nothing():
    variant, model = tiny("turbo")
    model = copy.deepcopy(model)  # ``tiny`` models are shared by the session's tests
    with torch.no_grad():  # a likelier EOS, so that some requests stop on it
        model.speech_head.weight[variant.t3.stop_speech_token] *= 2
    reqs = _mixed(variant, 8)
    want, _ = _run(variant, model, reqs, lookahead=False)
    assert any(reason is FinishReason.EOS for _, reason in want), "the case needs an EOS stop"
    got, _ = _run(variant, model, reqs, lookahead=True)
    assert got == want


def test_an_abort_while_a_step_is_ahead_frees_the_request_and_spares_the_others():
    variant, model = tiny("original")
    reqs = _requests(variant, 3, seed=4, max_tokens=30, ignore_eos=True)
    want, _ = _run(variant, model, reqs, lookahead=False)
    engine = _engine(variant, model)
    ids = [engine.add_request(r) for r in reqs]
    tokens = {rid: [] for rid in ids}
    for _ in range(12):
        for e in engine.step():
            if e.new_token is not None:
                tokens[e.request_id].append(e.new_token)
    assert engine._ahead is not None  # a step is in flight
    engine.abort(ids[1])
    engine.scheduler.check_invariants()
    while engine.has_unfinished_requests():
        for e in engine.step():
            assert e.request_id != ids[1]
            if e.new_token is not None:
                tokens[e.request_id].append(e.new_token)
    assert engine._ahead is None
    assert tokens[ids[0]] == want[0][0] and tokens[ids[2]] == want[2][0]
    assert engine.kv_manager.num_free_blocks == engine.kv_cache.num_blocks


def test_a_step_says_whether_it_computed_prompt_positions():
    variant, model = tiny("turbo")
    engine = _engine(variant, model, step_time_target_s=math.inf)  # each prompt in one chunk
    first, second = _requests(variant, 2, seed=5, max_tokens=30, ignore_eos=True)
    engine.add_request(first)
    prefilled = []
    for _ in range(4):
        engine.step()
        prefilled.append(engine.last_step_prefilled)
    engine.add_request(second)
    for _ in range(4):
        engine.step()
        prefilled.append(engine.last_step_prefilled)
    # the second is admitted beside the decoding first one in one mixed step, the step after the
    # one already queued ahead
    assert prefilled == [True, False, False, False, False, True, False, False]
