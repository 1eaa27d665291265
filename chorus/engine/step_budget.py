"""What one step may take besides its decode rows: the prefill positions that fit the step-time
target (``prefill_time_budget``; docs/engine.md, "Step time") and, where the engine holds mixed
CUDA graphs, the largest prompt part of a step that replays one (``PrefillShape``).

The scheduler asks these per step; the numbers come from its config, its ``StepCostModel`` and the
shape the engine gives it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from chorus.engine.config import SchedulerConfig
from chorus.engine.step_cost import StepCostModel

# Prefill a step may always take, even when its decode rows alone reach the step-time target:
# this share of the target's time (by the learned rate), and at least this many positions, so
# waiting requests keep advancing instead of waiting for running ones to end. An overloaded
# device's step then takes its decode rows' time plus at most half the target.
MIN_PREFILL_TARGET_SHARE = 0.5
MIN_PREFILL_TOKENS = 16


@dataclass(frozen=True)
class PrefillShape:
    """The most rows with prompt positions (``rows``, a CFG pair counting two) and prompt
    positions in all (``tokens``) that a step which also decodes may take. The engine sets the
    largest step its mixed CUDA graphs hold, so that a step admitting beside running rows
    replays a graph instead of running eagerly while every running row waits for it; what does
    not fit waits for the next steps. A step without decode rows is not bounded by it."""

    rows: int
    tokens: int

    def __post_init__(self):
        assert self.rows >= 1 and self.tokens >= 1, self


def prefill_time_budget(config: SchedulerConfig, cost: StepCostModel, target_s: float, decode_rows: int) -> int:
    """Prefill positions a step with ``decode_rows`` decode rows may take under the step-time
    target ``target_s``: what ``cost`` predicts fits, at least what fits in
    ``MIN_PREFILL_TARGET_SHARE`` of the target alone and ``MIN_PREFILL_TOKENS``;
    ``config.initial_prefill_tokens`` until a step with prefill has been timed; unbounded (the
    token budget decides) without a target (inf)."""
    if math.isinf(target_s):
        return config.max_num_batched_tokens
    fits = cost.prefill_budget(target_s, decode_rows)
    if fits is None:
        return config.initial_prefill_tokens
    rate = cost.prefill_token_s
    share = MIN_PREFILL_TARGET_SHARE * target_s / rate if rate > 0 else math.inf
    floor = max(MIN_PREFILL_TOKENS, int(min(share, config.max_num_batched_tokens)))
    return min(max(fits, floor), config.max_num_batched_tokens)


def within_prefill_shape(prefill_time: int, shape: PrefillShape | None) -> tuple[int, float]:
    """The prefill positions and prompt rows a step beside decode rows may take: ``prefill_time``
    and no row bound, each cut to ``shape`` where one is set."""
    if shape is None:
        return prefill_time, math.inf
    return min(prefill_time, shape.tokens), shape.rows
