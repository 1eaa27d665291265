"""The engine's use of shared-prefix attention: planned for many decode rows that share a long
prefix, and the tokens are those of plain attention."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.engine.engine import T3Request
from chorus.engine.model_runner import SHARED_PREFIX_MIN_ROWS, SHARED_PREFIX_MIN_SAVED_TOKENS
from chorus.sampling import SamplingParams
from tests.engine.shared_prefix_runs import generate_after_the_first
from tests.engine.test_engine_parity import _engine
from tests.engine.tiny_models import conditioning, tiny, voice


def _same_prompt(variant, model, n, max_tokens=12):
    """``n`` requests with one voice and one text (their whole prompt is a shared prefix)."""
    cond = conditioning(variant, model, voice(variant, 0))
    text = torch.randint(1, 600, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    return [T3Request(text, cond, SamplingParams.for_variant(variant, seed=i, max_new_tokens=max_tokens,
                                                             ignore_eos=True)) for i in range(n)]


def _generate(variant, model, reqs, shared: bool, kv_cache_dtype: str = "auto"):
    engine = _engine(variant, model, max_num_seqs=64, budget=8192, kv_cache_dtype=kv_cache_dtype)
    assert engine.runner.shared_prefix  # on by default, FP8 pools included
    engine.runner.shared_prefix = shared
    return generate_after_the_first(engine, reqs)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_many_rows_sharing_a_long_prompt_read_it_once_per_group_and_keep_their_tokens(kv_cache_dtype):
    """Also on an FP8 pool: the decomposition reads it with the layer's scales."""
    variant, model = tiny("turbo")
    reqs = _same_prompt(variant, model, SHARED_PREFIX_MIN_ROWS + 4)
    plain, planned_plain = _generate(variant, model, reqs, shared=False, kv_cache_dtype=kv_cache_dtype)
    shared, planned = _generate(variant, model, reqs, shared=True, kv_cache_dtype=kv_cache_dtype)
    assert not any(planned_plain) and sum(planned) >= len(planned) // 2
    assert shared == plain


def test_too_few_rows_are_not_planned():
    variant, model = tiny("turbo")
    reqs = _same_prompt(variant, model, SHARED_PREFIX_MIN_ROWS - 1)
    _, planned = _generate(variant, model, reqs, shared=True)
    assert not any(planned)


def _shared_tables(rows: int, shared: int = 25, own: int = 3):
    import numpy as np

    tables = np.zeros((rows, shared + own), np.int32)
    tables[:, :shared] = np.arange(shared)
    tables[:, shared:] = 1000 + np.arange(rows * own).reshape(rows, own)
    return tables, np.full(rows, 16 * (shared + own) - 3)


def test_a_plan_is_used_only_when_it_saves_enough_prefix_reads():
    variant, model = tiny("turbo")
    runner = _engine(variant, model).runner
    rows = SHARED_PREFIX_MIN_ROWS
    for shared_blocks in (10, 25):  # (rows - 1) x 160 and x 400 prefix reads saved
        seqs = [object() for _ in range(rows)]
        tables, seq_lens = _shared_tables(rows, shared=shared_blocks, own=30)  # long own suffixes
        plan = runner._shared_prefix_plan(seqs, tables, seq_lens, rows)
        saved = (rows - 1) * 16 * shared_blocks
        assert (plan is not None) == (saved >= SHARED_PREFIX_MIN_SAVED_TOKENS), (shared_blocks, saved)


def test_the_plan_is_kept_while_the_same_rows_decode_over_the_same_leading_blocks():
    variant, model = tiny("turbo")
    runner = _engine(variant, model).runner
    rows = SHARED_PREFIX_MIN_ROWS
    seqs = [object() for _ in range(rows)]
    tables, seq_lens = _shared_tables(rows)
    plan = runner._shared_prefix_plan(seqs, tables, seq_lens, rows)
    assert plan is not None and plan.num_groups == 1
    assert runner._shared_prefix_plan(seqs, tables, seq_lens + 1, rows) is plan  # one step later
    moved = tables.copy()
    moved[0, :5] = 500 + np.arange(5)  # a row back from preemption with new blocks
    replanned = runner._shared_prefix_plan(seqs, moved, seq_lens, rows)
    assert replanned is not plan and replanned.prefix_len[0] == 0
    assert runner._shared_prefix_plan([object()] + seqs[1:], tables, seq_lens, rows) is not replanned
