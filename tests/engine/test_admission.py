"""A request that could never run is refused when it is added, with the limit it breaks
(``chorus.engine.admission``), and nothing is queued or allocated for it."""
import pytest

from chorus.engine.admission import AdmissionError
from tests.engine.test_scheduler import make_request, make_scheduler


def test_request_over_max_model_len_is_rejected_with_a_clear_message():
    s = make_scheduler(max_model_len=32)
    with pytest.raises(AdmissionError, match=r"4 positions \(2 conditioning \+ 1 text \+ 1 BOS\).*"
                                             r"max_tokens is 30: 34 positions exceed max_model_len=32"):
        s.add_request(make_request("a", max_tokens=30))
    assert not s.has_unfinished_requests() and s.kv.num_free_blocks == 64


def test_request_larger_than_the_pool_is_rejected():
    s = make_scheduler(num_blocks=4)
    with pytest.raises(AdmissionError, match="KV blocks"):
        s.add_request(make_request("a", cfg=True, max_tokens=5))  # 2 rows x 3 blocks
