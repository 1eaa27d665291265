"""Running an engine so that decode rows share a cached voice prompt, recording which steps
planned shared-prefix attention (for the engine-level shared-prefix tests, CPU and GPU)."""
from __future__ import annotations


def generate_after_the_first(engine, reqs) -> tuple[list[list[int]], list[bool]]:
    """The first request until its first token (its prompt blocks are then cached), then the
    rest, whose decode rows share those blocks. Returns each request's tokens and, per step,
    whether the step had a shared-prefix plan."""
    planned = []
    prepare = engine.runner.prepare

    def spy(out, pending=None):
        inputs = prepare(out, pending)
        planned.append(inputs.metadata.shared_prefix is not None)
        return inputs

    engine.runner.prepare = spy
    ids = [engine.add_request(reqs[0])]
    tokens = {ids[0]: []}
    while not tokens[ids[0]]:
        for event in engine.step():
            if event.new_token is not None:
                tokens[event.request_id].append(event.new_token)
    ids += [engine.add_request(r) for r in reqs[1:]]
    tokens.update({rid: [] for rid in ids[1:]})
    while engine.has_unfinished_requests():
        for event in engine.step():
            if event.new_token is not None:
                tokens[event.request_id].append(event.new_token)
    return [tokens[rid] for rid in ids], planned
