"""Request / Sequence state: position keys, CFG rows, status machine, validation, queue order."""
import pytest

from chorus.engine.request import (
    Branch, FinishReason, PositionKind, Priority, Request, RequestQueue, RequestStatus, T3Prompt,
    conditioning_key, conditioning_length, position_key, split_key,
)
from chorus.models.variants import get_variant

BOS, EOS = 6561, 6562


def make_request(rid="r", *, cfg=False, priority=Priority.NORMAL, **kw):
    prompt = T3Prompt(cond_key=b"k", cond_len=3, text_ids=(7, 8), bos_token=BOS, eos_token=EOS,
                      bos_copies=2, cfg=cfg)
    return Request(rid, prompt, priority=priority, **kw)


def test_position_keys_lay_out_conditioning_text_then_bos():
    keys = make_request().sequences[0].keys
    assert [split_key(k) for k in keys] == [
        (PositionKind.COND, 0), (PositionKind.COND, 1), (PositionKind.COND, 2),
        (PositionKind.TEXT, 7), (PositionKind.TEXT, 8),
        (PositionKind.SPEECH, BOS), (PositionKind.SPEECH, BOS),
    ]


def test_unconditional_row_tags_its_text_positions_only():
    cond, uncond = make_request(cfg=True).sequences
    assert uncond.keys[:3] == cond.keys[:3] and uncond.keys[5:] == cond.keys[5:]
    assert [split_key(k)[0] for k in uncond.keys[3:5]] == [PositionKind.UNCOND_TEXT] * 2


def test_cfg_request_owns_two_rows_with_distinct_ids():
    request = make_request("r", cfg=True)
    assert request.num_rows == 2 and [s.branch for s in request.sequences] == [Branch.COND, Branch.UNCOND]
    assert [s.seq_id for s in request.sequences] == ["r/cond", "r/uncond"]


def test_generated_tokens_are_appended_to_both_rows():
    request = make_request(cfg=True)
    request.append_output(42)
    assert request.output_tokens == [42]
    assert all(s.keys[-1] == position_key(PositionKind.SPEECH, 42) for s in request.sequences)
    assert request.num_tokens == request.prompt.num_tokens + 1


def test_status_machine_allows_preempt_and_resume():
    request = make_request()
    for status in (RequestStatus.RUNNING, RequestStatus.PREEMPTED, RequestStatus.RUNNING):
        request.set_status(status)
    request.finish(FinishReason.EOS)
    assert request.is_finished and request.finish_reason is FinishReason.EOS


def test_finished_request_cannot_run_again():
    request = make_request()
    request.finish(FinishReason.ABORTED)
    with pytest.raises(AssertionError):
        request.set_status(RequestStatus.RUNNING)


@pytest.mark.parametrize("kw, message", [
    (dict(priority=3), "priority"), (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
])
def test_invalid_limits_are_rejected_with_a_clear_message(kw, message):
    with pytest.raises(ValueError, match=message):
        make_request(**kw)


def test_prompt_for_turbo_rejects_cfg_and_uses_one_bos():
    t3 = get_variant("turbo").t3
    with pytest.raises(ValueError, match="CFG"):
        T3Prompt.for_variant(t3, cond_key=b"k", cond_len=10, text_ids=[1], cfg=True)
    assert T3Prompt.for_variant(t3, cond_key=b"k", cond_len=10, text_ids=[1]).bos_copies == 1


def test_prompt_for_original_frames_the_text_like_the_model():
    t3 = get_variant("original").t3
    prompt = T3Prompt.for_variant(t3, cond_key=b"k", cond_len=34, text_ids=[5, 6], cfg=True)
    assert prompt.text_ids == (t3.start_text_token, 5, 6, t3.stop_text_token)
    assert prompt.num_tokens == 34 + 4 + 2


def test_conditioning_length_per_variant():
    assert conditioning_length(get_variant("original").t3, 150) == 34
    assert conditioning_length(get_variant("turbo").t3, 375) == 376


def test_conditioning_key_tells_close_exaggerations_apart():
    assert conditioning_key("original", "h", 0.5) != conditioning_key("original", "h", 0.5000001)
    assert conditioning_key("original", "h", 0.5) == conditioning_key("original", "h", 0.5)


def test_queue_orders_by_priority_then_arrival():
    low, normal1, high, normal2 = (make_request(f"r{i}", priority=p) for i, p in
                                   enumerate([Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.NORMAL]))
    queue = RequestQueue()
    for r in (low, normal1, high, normal2):
        queue.push(r)
    assert [queue.pop() for _ in range(4)] == [high, normal1, normal2, low]


def test_requeued_request_goes_back_ahead_of_later_arrivals():
    first, second = make_request("a"), make_request("b")
    queue = RequestQueue()
    queue.push(second)
    queue.push(first)  # e.g. preempted, arrived earlier
    assert queue.peek() is first


def test_queue_remove_keeps_order():
    a, b, c = make_request("a"), make_request("b"), make_request("c")
    queue = RequestQueue()
    for r in (a, b, c):
        queue.push(r)
    assert queue.remove(a) and not queue.remove(a)
    assert list(queue) == [b, c]
