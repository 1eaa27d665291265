"""The shared-prefix planner: which decode rows form groups, and over how many tokens."""
import numpy as np
import pytest

from chorus.engine.attention import plan_shared_prefixes
from chorus.engine.attention.shared_prefix import empty_plan

BS = 16


def _plan(rows, seq_lens, num_decodes=None, **kw):
    """``rows``: each row's leading block ids (padded with distinct junk to one width)."""
    width = max(len(r) for r in rows) + 2
    table = np.full((len(rows), width), 0, np.int32)
    for i, r in enumerate(rows):
        table[i] = r + [10_000 + 100 * i + j for j in range(width - len(r))]
    seq_lens = np.array(seq_lens, np.int32)
    num_decodes = len(rows) if num_decodes is None else num_decodes
    plan = plan_shared_prefixes(table, seq_lens, num_decodes, BS, **kw)
    _check_invariants(plan, table, seq_lens, num_decodes)
    return plan


def _check_invariants(plan, table, seq_lens, num_decodes):
    rows = len(seq_lens)
    assert plan.prefix_len.shape == plan.group_rows.shape == (rows,)
    assert plan.group_start.shape == (rows + 1,)
    assert sorted(plan.group_rows.tolist()) == list(range(rows))
    assert plan.group_start[0] == 0 and (np.diff(plan.group_start) >= 0).all()
    assert (plan.group_start[plan.num_groups:] == plan.group_start[plan.num_groups]).all()
    assert (plan.prefix_len % BS == 0).all()
    grouped = set()
    for g in range(plan.num_groups):
        members = plan.group_rows[plan.group_start[g]:plan.group_start[g + 1]]
        lens = plan.prefix_len[members]
        assert len(members) >= 2 and lens[0] > 0 and (lens == lens[0]).all()
        blocks = lens[0] // BS
        assert (table[members, :blocks] == table[members[0], :blocks]).all()
        assert (lens[0] < seq_lens[members]).all() and (members < num_decodes).all()
        grouped |= set(members.tolist())
    assert all(plan.prefix_len[r] == 0 for r in range(rows) if r not in grouped)


def _groups(plan):
    return [sorted(plan.group_rows[plan.group_start[g]:plan.group_start[g + 1]].tolist())
            for g in range(plan.num_groups)]


def test_no_sharing_gives_an_empty_plan():
    plan = _plan([[1, 2, 3], [4, 5, 6], [7, 8]], [40, 45, 20])
    assert plan.num_groups == 0 and plan.shared_rows == 0
    assert (plan.prefix_len == 0).all() and plan.group_rows.tolist() == [0, 1, 2]


def test_one_group_shares_every_common_full_block():
    plan = _plan([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 3]], [4 * BS, 3 * BS + 7, 3 * BS + 1])
    assert _groups(plan) == [[0, 1, 2]]
    assert plan.prefix_len.tolist() == [3 * BS] * 3
    assert plan.prefix_tokens_saved == 2 * 3 * BS


def test_two_interleaved_groups_and_a_loner():
    plan = _plan([[1, 2, 3], [5, 6, 7], [1, 2, 4], [5, 6, 7], [9, 9, 9]],
                 [3 * BS + 2, 3 * BS + 2, 3 * BS + 2, 3 * BS + 9, 3 * BS + 2])
    assert sorted(_groups(plan)) == [[0, 2], [1, 3]]
    assert plan.prefix_len.tolist() == [2 * BS, 3 * BS, 2 * BS, 3 * BS, 0]
    assert plan.group_rows[plan.shared_rows:].tolist() == [4]


def test_partial_overlap_takes_the_run_common_to_all_rows():
    # rows 0 and 1 share three blocks, row 2 only the first with them: the group shares one
    plan = _plan([[1, 2, 3, 4], [1, 2, 3, 5], [1, 7, 3, 4]], [5 * BS] * 3)
    assert _groups(plan) == [[0, 1, 2]] and plan.prefix_len.tolist() == [BS] * 3


def test_a_shared_block_holding_the_rows_last_position_is_not_shared():
    # same four block ids, but row 1's context ends inside block 3 and row 2's fills it
    # exactly: its last (new) position is there, so only blocks 0-2 are common full blocks
    plan = _plan([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]], [5 * BS, 4 * BS - 3, 4 * BS])
    assert plan.prefix_len.tolist() == [3 * BS] * 3


def test_rows_within_their_first_block_are_never_grouped():
    plan = _plan([[1], [1], [1, 2]], [BS, 5, BS + 1])
    assert plan.num_groups == 0 and (plan.prefix_len == 0).all()


def test_padding_rows_without_context_are_ignored():
    plan = _plan([[1, 2], [1, 2], [1, 2]], [2 * BS + 1, 0, 2 * BS + 3])
    assert _groups(plan) == [[0, 2]] and plan.prefix_len.tolist() == [2 * BS, 0, 2 * BS]


def test_prefill_rows_are_never_grouped():
    plan = _plan([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]], [3 * BS + 1] * 4, num_decodes=2)
    assert _groups(plan) == [[0, 1]] and plan.prefix_len.tolist() == [3 * BS, 3 * BS, 0, 0]


def test_groups_under_min_rows_are_dropped():
    rows = [[1, 2], [1, 2], [3, 4], [3, 4], [3, 4]]
    plan = _plan(rows, [2 * BS + 1] * 5, min_rows=3)
    assert _groups(plan) == [[2, 3, 4]] and plan.prefix_len.tolist() == [0, 0] + [2 * BS] * 3
    with pytest.raises(AssertionError):
        _plan(rows, [2 * BS + 1] * 5, min_rows=1)


def test_max_groups_keeps_the_groups_that_save_the_most_reads():
    rows = [[1, 2], [1, 2], [3, 4, 5, 6], [3, 4, 5, 6], [7, 8], [7, 8], [7, 8]]
    lens = [2 * BS + 1, 2 * BS + 1, 4 * BS + 1, 4 * BS + 1, 2 * BS + 1, 2 * BS + 1, 2 * BS + 1]
    plan = _plan(rows, lens, max_groups=1)   # saves: 1 x 2, 1 x 4, 2 x 2 blocks
    assert _groups(plan) == [[2, 3]]
    assert _plan(rows, lens, max_groups=0).num_groups == 0


def test_random_tables_match_a_row_by_row_plan():
    rng = np.random.default_rng(7)
    for _ in range(20):
        rows = int(rng.integers(1, 40))
        voices = rng.integers(0, 4, rows)
        table = rng.integers(100, 10_000, (rows, 12)).astype(np.int32)
        voice_blocks = rng.integers(100, 10_000, (4, 12))
        shared = rng.integers(0, 12, rows)
        for r in range(rows):
            table[r, :shared[r]] = voice_blocks[voices[r], :shared[r]]
        lens = rng.integers(0, 12 * BS, rows).astype(np.int32)
        decodes = int(rng.integers(0, rows + 1))
        plan = plan_shared_prefixes(table, lens, decodes, BS)
        _check_invariants(plan, table, lens, decodes)
        # brute force: rows grouped by first block; prefix = common full-block run of all
        expect = np.zeros(rows, np.int64)
        full = [max(int(n) - 1, 0) // BS for n in lens[:decodes]]
        by_first = {}
        for r in range(decodes):
            if full[r] > 0:
                by_first.setdefault(int(table[r, 0]), []).append(r)
        for members in by_first.values():
            if len(members) < 2:
                continue
            blocks = 0
            while all(blocks < full[r] and table[r, blocks] == table[members[0], blocks]
                      for r in members):
                blocks += 1
            expect[members] = blocks * BS
        assert plan.prefix_len.tolist() == expect.tolist()


def test_empty_plan_shape():
    plan = empty_plan(3)
    assert plan.num_groups == 0 and plan.group_start.tolist() == [0, 0, 0, 0]
