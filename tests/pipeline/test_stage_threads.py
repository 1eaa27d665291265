"""On a CPU the two stage threads share torch's intra-op threads instead of each using all of
them, and the pipeline reports each stage's work to a timing listener."""
from __future__ import annotations

import threading

import pytest
import torch

from chorus.pipeline.pipeline import Pipeline
from tests.pipeline.test_pipeline import _pipeline, _request


class Seen:
    """What the timing listener saw: per stage, the calls and the intra-op threads of the
    thread that made them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: dict[str, set[int]] = {}

    def __call__(self, stage: str, seconds: float) -> None:
        assert seconds >= 0
        with self.lock:
            self.threads.setdefault(stage, set()).add(torch.get_num_threads())


@pytest.fixture()
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def _run(pipe: Pipeline) -> Seen:
    seen = Seen()
    pipe.set_timing_listener(seen)
    try:
        pipe.synthesize(_request(tokens=8))
    finally:
        pipe.close()
    return seen


def test_each_stage_reports_its_work(four_threads):
    seen = _run(_pipeline("turbo"))
    assert set(seen.threads) == {"queue", "t3", "t3_prefill", "vocoder"}


def test_on_a_cpu_the_stage_threads_split_the_intra_op_threads(four_threads):
    seen = _run(_pipeline("turbo"))
    assert seen.threads["t3"] == {2} and seen.threads["vocoder"] == {2}
    assert torch.get_num_threads() == 4  # closing gives the caller its setting back


def test_without_the_split_both_stages_use_every_thread(four_threads):
    seen = _run(_pipeline("turbo", split_cpu_threads=False))
    assert seen.threads["t3"] == {4} and seen.threads["vocoder"] == {4}


def test_the_vocoder_thread_offers_the_stage_its_idle_moments_for_graph_captures(monkeypatch):
    pipe = _pipeline("turbo")
    try:
        stage, offered_idle = pipe.vocoder, threading.Event()
        real = stage.capture_while_idle

        def watch() -> bool:
            if not stage._jobs:
                offered_idle.set()
            return real()

        monkeypatch.setattr(stage, "capture_while_idle", watch)
        pipe.synthesize(_request(tokens=8))
        offered_idle.clear()
        assert offered_idle.wait(timeout=30)  # the thread keeps offering while it has nothing to do
    finally:
        pipe.close()
