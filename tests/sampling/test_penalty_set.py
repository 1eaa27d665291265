from __future__ import annotations

import torch

from chorus.models.variants import get_variant
from chorus.sampling import NO_TOKEN, initial_penalty_mask, penalty_mask_from_history, record_sampled_tokens

EN = get_variant("original")
TURBO = get_variant("turbo")
BOS = 6561


def _ids(mask_row):
    return set(torch.nonzero(mask_row).flatten().tolist())


def test_first_step_penalises_bos_only():
    for variant in (EN, TURBO):
        assert _ids(initial_penalty_mask(variant, 1)[0]) == {BOS}


def test_en_keeps_bos_with_the_generated_tokens():
    seen = initial_penalty_mask(EN, 1)
    for step, token in enumerate([5, 9, 5]):
        record_sampled_tokens(EN, seen, torch.tensor([token]), torch.tensor([step]))
    assert _ids(seen[0]) == {BOS, 5, 9}


def test_turbo_drops_bos_after_the_first_token():
    seen = initial_penalty_mask(TURBO, 1)
    for step, token in enumerate([5, 9, 5]):
        record_sampled_tokens(TURBO, seen, torch.tensor([token]), torch.tensor([step]))
    assert _ids(seen[0]) == {5, 9}


def test_turbo_keeps_a_generated_bos():
    seen = initial_penalty_mask(TURBO, 1)
    record_sampled_tokens(TURBO, seen, torch.tensor([BOS]), torch.tensor([0]))
    assert _ids(seen[0]) == {BOS}


def test_rows_without_a_token_are_left_alone():
    seen = penalty_mask_from_history(EN, [[3], [4]])
    record_sampled_tokens(EN, seen, torch.tensor([NO_TOKEN, 0]), torch.tensor([1, 1]))
    assert _ids(seen[0]) == {BOS, 3} and _ids(seen[1]) == {BOS, 4, 0}


def test_rebuilt_masks_equal_incrementally_kept_ones():
    histories = [[1, 2, 2, 6000], [], [BOS, 6562 - 2]]
    for variant in (EN, TURBO):
        seen = initial_penalty_mask(variant, 3)
        for step in range(4):
            tokens = torch.tensor([h[step] if step < len(h) else NO_TOKEN for h in histories])
            record_sampled_tokens(variant, seen, tokens, torch.full((3,), step))
        assert torch.equal(seen, penalty_mask_from_history(variant, histories))
