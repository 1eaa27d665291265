"""The capture gate's ordering, on the CPU: the CUDA calls it guards are replaced by recorders
(the gate's own logic is what is tested here; tests/engine/test_engine_gpu.py and
tests/vocoder/test_pass_graphs.py capture real graphs beside a synchronising thread on a GPU)."""
from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from chorus import capture_gate


@pytest.fixture
def events(monkeypatch) -> list[str]:
    seen: list[str] = []

    @contextlib.contextmanager
    def graph(*args, **kwargs):
        seen.append("capture starts")
        yield
        seen.append("capture ends")

    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: seen.append("empty_cache"))
    return seen


def test_a_synchronisation_waits_for_the_capture_under_way(events):
    thread = threading.Thread(target=capture_gate.synchronize)
    with capture_gate.capture(object(), stream=object()):
        thread.start()
        thread.join(timeout=0.2)
        assert thread.is_alive()  # held at the gate
    thread.join()
    assert events == ["capture starts", "capture ends", "synchronize"]


def test_emptying_the_cache_waits_too(events):
    thread = threading.Thread(target=capture_gate.empty_cache)
    with capture_gate.capture(object(), stream=object()):
        thread.start()
        thread.join(timeout=0.2)
    thread.join()
    assert events == ["capture starts", "capture ends", "empty_cache"]


def test_a_capture_waits_for_the_synchronisation_under_way(events, monkeypatch):
    inside, release = threading.Event(), threading.Event()

    def slow_synchronize(device=None):
        inside.set()
        release.wait()
        events.append("synchronize")

    monkeypatch.setattr(torch.cuda, "synchronize", slow_synchronize)
    syncing = threading.Thread(target=capture_gate.synchronize)
    syncing.start()
    inside.wait()

    def capture():
        with capture_gate.capture(object(), stream=object()):
            pass

    capturing = threading.Thread(target=capture)
    capturing.start()
    capturing.join(timeout=0.2)
    assert capturing.is_alive()
    release.set()
    syncing.join()
    capturing.join()
    assert events == ["synchronize", "capture starts", "capture ends"]


def _twenty_captures_beside(step) -> None:
    """Twenty captures on this thread while another thread runs ``step()`` in a loop."""
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            step()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        for _ in range(20):
            with capture_gate.capture(object(), stream=object()):
                pass
    finally:
        stop.set()
        thread.join()


def test_a_thread_synchronising_in_a_loop_does_not_starve_a_capture(events):
    _twenty_captures_beside(capture_gate.synchronize)
    assert events.count("capture starts") == events.count("capture ends") == 20


def test_synchronising_inside_a_capture_is_refused(events):
    with capture_gate.capture(object(), stream=object()):
        with pytest.raises(RuntimeError, match="inside a graph capture would invalidate it"):
            capture_gate.synchronize()
    capture_gate.synchronize()  # and allowed again after it
    assert events == ["capture starts", "capture ends", "synchronize"]


def test_a_capture_waits_for_the_capture_under_way(events):
    # torch.cuda.graph begins with a device-wide synchronisation, which would break the first capture
    def capture():
        with capture_gate.capture(object(), stream=object()):
            events.append("second capture's body")

    thread = threading.Thread(target=capture)
    with capture_gate.capture(object(), stream=object()):
        thread.start()
        thread.join(timeout=0.2)
        assert thread.is_alive()  # held at the gate
        events.append("first capture's body")
    thread.join()
    assert events == ["capture starts", "first capture's body", "capture ends",
                      "capture starts", "second capture's body", "capture ends"]


def test_a_capture_inside_a_capture_is_refused(events):
    with capture_gate.capture(object(), stream=object()):
        with pytest.raises(RuntimeError, match="capture one graph at a time"):
            with capture_gate.capture(object(), stream=object()):
                pass
    with capture_gate.capture(object(), stream=object()):  # and the gate is open again after it
        pass
    assert events == ["capture starts", "capture ends"] * 2


def test_a_thread_capturing_in_a_loop_does_not_starve_another_capture(events):
    # the vocoder thread captures due graphs back to back while T3's thread waits to capture one;
    # a real capture lets go of the GIL inside (CUDA calls), so the waiter wakes while the gate is
    # taken, and the looping thread took it again before the waiter could run
    looped = [0]

    def capture():
        with capture_gate.capture(object(), stream=object()):
            time.sleep(0.001)  # a CUDA call, without the GIL
            looped[0] += 1

    _twenty_captures_beside(capture)
    assert looped[0] > 0 and events.count("capture starts") == events.count("capture ends") == 20 + looped[0]
