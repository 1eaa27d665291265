"""``SchedulerConfig.admit_ahead``: arrivals admitted in the step scheduled ahead (beside the
decode rows in flight) get exactly the tokens of the reference, and the engine then takes fewer
regular (synchronous) steps."""
from __future__ import annotations

import dataclasses
import math

import pytest

from tests.engine.test_engine_parity import _engine, _requests, _sequential
from tests.engine.tiny_models import tiny


def _staggered(engine, requests, every: int = 3) -> list[list[int]]:
    """Add ``requests`` one every ``every`` steps while the earlier ones decode, step until all
    have ended; each request's tokens, in the order given."""
    waiting, ids, tokens, steps = list(requests), [], {}, 0
    while waiting or engine.has_unfinished_requests():
        if waiting and steps % every == 0:
            ids.append(engine.add_request(waiting.pop(0)))
        for out in engine.step():
            if out.new_token is not None:
                tokens.setdefault(out.request_id, []).append(out.new_token)
        steps += 1
    engine.scheduler.check_invariants()
    return [tokens.get(request_id, []) for request_id in ids]


def _with(engine, admit_ahead: bool):
    scheduler = dataclasses.replace(engine.config.scheduler, admit_ahead=admit_ahead)
    engine.config = dataclasses.replace(engine.config, scheduler=scheduler)
    engine.scheduler.config = scheduler
    return engine


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_arrivals_admitted_ahead_get_the_reference_tokens(name):
    variant, model = tiny(name)
    requests = _requests(variant, 5, seed=7, max_tokens=16)
    engine = _with(_engine(variant, model), admit_ahead=True)
    got = _staggered(engine, requests)
    assert got == [_sequential(variant, model, r) for r in requests]
    assert engine.kv_manager.num_free_blocks == engine.kv_cache.num_blocks


def test_admitting_ahead_leaves_only_the_first_step_to_the_regular_schedule():
    variant, model = tiny("turbo")
    regular = {}
    for admit_ahead in (False, True):
        engine = _with(_engine(variant, model, step_time_target_s=math.inf), admit_ahead)  # whole prompts
        _staggered(engine, _requests(variant, 6, seed=8, max_tokens=20, ignore_eos=True))
        regular[admit_ahead] = engine.num_steps - engine.num_steps_ahead
    assert regular == {False: 6, True: 1}  # without it, every arrival's step is a regular one


def test_arrivals_admitted_ahead_beside_preemptions_get_the_reference_tokens():
    variant, model = tiny("turbo")
    requests = _requests(variant, 6, seed=3, max_tokens=40, ignore_eos=True)
    engine = _with(_engine(variant, model, num_blocks=80, max_model_len=512), admit_ahead=True)
    got = _staggered(engine, requests, every=2)
    assert engine.scheduler.num_preemptions > 0
    assert got == [_sequential(variant, model, r) for r in requests]
    assert engine.kv_manager.num_free_blocks == 80
