"""The Ray tests' child process (ray_child.py), with a plain context instead of a cluster: a call's
answer comes back, and a failure, a death or a hang in the child fails the test that waits on it."""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time

import pytest

from tests.server.ray_child import Child

pytestmark = pytest.mark.timeout(120)
_STARTED: list[subprocess.Popen] = []  # (in the child) the process start_a_process started


@contextlib.contextmanager
def held(value):
    yield value


def add_in(value, more) -> tuple[object, int]:
    return value + more, os.getpid()


def check(value) -> None:
    assert value == "expected", "the child's own message"


def die(value) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def start_a_process(value) -> int:
    _STARTED.append(subprocess.Popen(["sleep", "600"]))
    return _STARTED[-1].pid


def hang(value) -> None:
    time.sleep(600)


def test_a_call_returns_what_the_function_returns_in_the_child():
    with Child(held, 40, timeout_s=60) as child:
        total, pid = child.run(add_in, 2, timeout_s=60)
    assert total == 42 and pid != os.getpid()


def test_a_failure_in_the_child_fails_the_test_with_the_childs_traceback():
    with Child(held, "other", timeout_s=60) as child:
        with pytest.raises(pytest.fail.Exception) as failed:
            child.run(check, timeout_s=60)
        assert "check failed in the Ray driver's child process" in str(failed.value)
        assert "AssertionError: the child's own message" in str(failed.value)
        assert child.run(add_in, "!", timeout_s=60)[0] == "other!"  # the child keeps answering


def test_a_child_that_dies_without_answering_fails_the_test_with_its_signal():
    with Child(held, None, timeout_s=60) as child:
        with pytest.raises(pytest.fail.Exception) as failed:
            child.run(die, timeout_s=60)
        assert "die: the Ray driver's child process died of signal SIGKILL without answering" in str(failed.value)
        with pytest.raises(pytest.fail.Exception, match=r"is gone \(it died during die\)"):
            child.run(add_in, 1, timeout_s=60)


def test_a_call_without_an_answer_in_time_kills_the_childs_process_group():
    with Child(held, None, timeout_s=60) as child:
        started = os.pidfd_open(child.run(start_a_process, timeout_s=60))  # readable once that process ends
        try:
            with pytest.raises(pytest.fail.Exception, match="no answer .* within 1 s; killed it and its process group"):
                child.run(hang, timeout_s=1)
            assert select.select([started], [], [], 60)[0] == [started]
        finally:
            os.close(started)
