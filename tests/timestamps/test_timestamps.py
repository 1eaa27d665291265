import pytest
import torch

from chorus.timestamps import ChunkTimings, estimate, from_alignment, split_words, word_columns

TEXT = "Hello big world."
# SOT, "Hello", " big", " world", ".", EOT
SPANS = [None, (0, 5), (5, 9), (9, 15), (15, 16), None]


def _map(placements: list[int], columns: int = len(SPANS)) -> torch.Tensor:
    """A map whose row k attends most to column ``placements[k]``."""
    rows = torch.full((len(placements), columns), 0.01)
    rows[torch.arange(len(placements)), torch.tensor(placements)] = 0.9
    return rows


DIAGONAL = [1] * 5 + [2] * 5 + [3] * 6 + [4] * 2 + [5] * 2  # 20 speech tokens


def _bounds(timings) -> list[float]:
    return [t for timing in timings for t in (timing.start, timing.end)]


def _check_well_formed(timings: ChunkTimings, text: str, span: tuple[float, float]) -> None:
    words = timings.words
    assert [w.text for w in words] == [text[a:b] for a, b in split_words(text)]
    assert words[0].start >= span[0] and words[-1].end <= span[1]
    for before, after in zip(words, words[1:]):
        assert before.end <= after.start
    assert all(w.end > w.start for w in words)
    assert "".join(c.text for c in timings.characters) == "".join(w.text for w in words)
    assert all(c.end > c.start for c in timings.characters)


def test_split_words_keeps_punctuation_with_its_word():
    assert [TEXT[a:b] for a, b in split_words(TEXT)] == ["Hello", "big", "world."]


def test_split_words_makes_each_cjk_character_a_word():
    text = "你好，世界。"
    assert [text[a:b] for a, b in split_words(text)] == ["你", "好，", "世", "界。"]


def test_word_columns_are_the_overlapping_tokens():
    assert word_columns(split_words(TEXT), SPANS) == [(1, 2), (2, 3), (3, 5)]


def test_alignment_places_words_at_25_tokens_per_second():
    timings = from_alignment(TEXT, _map(DIAGONAL), SPANS, span=(1.0, 3.0))
    assert timings.method == "alignment"
    assert _bounds(timings.words) == pytest.approx([1.0, 1.2, 1.2, 1.4, 1.4, 1.72])
    _check_well_formed(timings, TEXT, (1.0, 3.0))


def test_alignment_timings_scale_with_speed():
    slow = from_alignment(TEXT, _map(DIAGONAL), SPANS, span=(1.0, 3.0))
    fast = from_alignment(TEXT, _map(DIAGONAL), SPANS, span=(1.0, 3.0), speed=2.0)
    for s, f in zip(slow.words, fast.words):
        assert (f.start - 1.0, f.end - 1.0) == pytest.approx(((s.start - 1.0) / 2, (s.end - 1.0) / 2))


def test_characters_share_their_word_evenly():
    timings = from_alignment(TEXT, _map(DIAGONAL), SPANS, span=(0.0, 3.0))
    hello = timings.characters[:5]
    assert [c.text for c in hello] == list("Hello")
    assert _bounds(hello) == pytest.approx([0.04 * (i // 2 + i % 2) for i in range(10)])


def test_attention_moving_back_does_not_move_time_back():
    placements = [1] * 5 + [3] * 3 + [2] * 2 + [3] * 6 + [5] * 4  # jumps ahead, then looks back
    timings = from_alignment(TEXT, _map(placements), SPANS, span=(0.0, 3.0))
    _check_well_formed(timings, TEXT, (0.0, 3.0))


def test_a_skipped_word_still_gets_an_interval():
    placements = [1] * 5 + [3] * 10 + [5] * 2  # "big" never attended
    timings = from_alignment(TEXT, _map(placements), SPANS, span=(0.0, 3.0))
    _check_well_formed(timings, TEXT, (0.0, 3.0))
    big = timings.words[1]
    assert timings.words[0].end == big.start and big.end == timings.words[2].start


def test_words_past_the_span_end_are_kept_inside_it():
    timings = from_alignment(TEXT, _map(DIAGONAL), SPANS, span=(0.0, 0.3))  # audio trimmed short
    _check_well_formed(timings, TEXT, (0.0, 0.3))
    assert timings.words[-1].end == 0.3


def test_map_width_must_match_the_text_tokens():
    with pytest.raises(ValueError, match=r"expected \[speech tokens, 6 text tokens\]"):
        from_alignment(TEXT, torch.zeros(3, 5), SPANS, span=(0.0, 1.0))


@pytest.mark.parametrize("span, speed", [((1.0, 0.5), 1.0), ((-1.0, 1.0), 1.0), ((0.0, 1.0), 0.0)])
def test_bad_span_or_speed_is_refused(span, speed):
    with pytest.raises(ValueError, match="span must satisfy|speed must be > 0"):
        from_alignment(TEXT, _map(DIAGONAL), SPANS, span=span, speed=speed)


def test_estimate_fills_the_span_by_characters_and_pauses():
    text = "Hi there. Bye"
    timings = estimate(text, span=(2.0, 4.0))
    assert timings.method == "estimate"
    _check_well_formed(timings, text, (2.0, 4.0))
    # weights: "Hi" 2, "there." 6 + 4 (sentence pause), "Bye" 3 -> 15 in all
    first, second = 2.0 + 2 * 2 / 15, 2.0 + 2 * 12 / 15
    assert _bounds(timings.words) == pytest.approx([2.0, first, first, second, second, 4.0])


def test_estimate_scales_with_the_span():
    text = "one, two three"
    normal = estimate(text, span=(0.0, 3.0))
    faster = estimate(text, span=(0.0, 1.5))  # the same chunk at speed 2
    for n, f in zip(normal.words, faster.words):
        assert (f.start, f.end) == pytest.approx((n.start / 2, n.end / 2))


def test_text_without_words_has_no_timings():
    assert estimate("  ", span=(0.0, 1.0)).words == ()
    assert from_alignment(" ", torch.zeros(2, 2), [None, None], span=(0.0, 1.0)).words == ()


def test_a_map_without_rows_shares_the_span_by_characters():
    timings = from_alignment(TEXT, torch.zeros(0, len(SPANS)), SPANS, span=(1.0, 2.0))
    _check_well_formed(timings, TEXT, (1.0, 2.0))
    assert (timings.words[0].start, timings.words[-1].end) == (1.0, 2.0)
