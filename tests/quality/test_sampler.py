"""The DNSMOS sampler (chorus/quality/sampler.py) with its real worker process and model: a score
comes back as the serving process would compute it, a full queue skips and counts, a worker that
dies is counted and replaced (or, dying again and again, reported as down), and closing leaves no
process behind. Its listener is the server's real metrics (``DnsmosMetrics``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("speechmos")

from prometheus_client import CollectorRegistry  # noqa: E402

from chorus.audio import load_audio  # noqa: E402
from chorus.quality.dnsmos import DNSMOS, Job  # noqa: E402
from chorus.quality.sampler import QualitySampler  # noqa: E402
from chorus.server.metrics import DnsmosMetrics  # noqa: E402
from tests.conftest import DATA_DIR  # noqa: E402

pytestmark = pytest.mark.timeout(300)

RATE = 24_000


class Watched(DnsmosMetrics):
    """The server's DNSMOS metrics on a registry of their own; every call the sampler makes
    wakes :meth:`wait_for`."""

    def __init__(self):
        self.registry = CollectorRegistry()
        super().__init__(self.registry)
        self._changed = threading.Condition()
        self.scored_ids: list[str] = []
        self.last = None

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def scored(self, job, scores, seconds):
        super().scored(job, scores, seconds)
        self.scored_ids.append(job.request_id)
        self.last = scores
        self._notify()

    def skipped(self, reason):
        super().skipped(reason)
        self._notify()

    def worker_up(self, up):
        super().worker_up(up)
        self._notify()

    def worker_died(self):
        super().worker_died()
        self._notify()

    def value(self, name: str, **labels) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def skipped_count(self, reason: str) -> float:
        return self.value("chorus_dnsmos_skipped_requests_total", reason=reason)

    def wait_for(self, condition, what: str, timeout: float = 120.0) -> None:
        with self._changed:
            assert self._changed.wait_for(condition, timeout), f"timed out waiting for {what}"


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return load_audio(os.path.join(DATA_DIR, "sample-01.mp3"), RATE).samples  # 5.7 s of a real voice


@pytest.fixture
def watched() -> Watched:
    return Watched()


def _job(wav: np.ndarray, request_id: str = "r") -> Job:
    return Job(wav, RATE, 0.5, 0.5, request_id)


def _gone(pid: int) -> bool:
    """Whether no process has this id (a dead child not yet reaped still has one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("repeats", [1, 7], ids=["5.7s", "40s"])
def test_the_worker_scores_a_clip_as_the_serving_process_would(watched, speech, repeats):
    clip = np.tile(speech, repeats)  # 40 s: longer than the 36 s scored, so only its start is sent
    sampler = QualitySampler(1.0, watched)
    try:
        sampler.offer(_job(clip))
        watched.wait_for(lambda: watched.scored_ids, "the score")
    finally:
        sampler.close()
    assert watched.last == DNSMOS().score(clip, RATE)
    assert watched.value("chorus_dnsmos_score_count", score="ovrl", cfg_weight="0.5", exaggeration="0.5") == 1
    assert watched.value("chorus_dnsmos_scoring_seconds_count") == 1


def test_a_full_queue_skips_and_counts_instead_of_waiting(watched, speech):
    long = np.tile(speech, 6)  # 34 s: seconds of scoring each, while 20 offers take microseconds
    sampler = QualitySampler(1.0, watched, capacity=2)
    try:
        for i in range(20):
            sampler.offer(_job(long, f"r{i}"))
        skipped = watched.skipped_count("queue_full")
        watched.wait_for(lambda: len(watched.scored_ids) + skipped == 20, "every offer scored or skipped")
    finally:
        sampler.close()
    assert skipped >= 15  # two queued and one being scored, at most a few more taken meanwhile
    assert watched.scored_ids == [f"r{i}" for i in range(len(watched.scored_ids))]


def test_a_worker_killed_while_idle_is_counted_and_replaced(watched, speech):
    sampler = QualitySampler(1.0, watched, restart_backoff_s=0.01)
    try:
        first = sampler.worker_pid
        os.kill(first, signal.SIGKILL)
        watched.wait_for(lambda: watched.value("chorus_dnsmos_worker_deaths_total") == 1
                         and watched.value("chorus_dnsmos_worker_up") == 1, "the restarted worker")
        assert sampler.worker_pid != first and _gone(first)
        sampler.offer(_job(speech))
        watched.wait_for(lambda: watched.scored_ids, "a score from the new worker")
    finally:
        sampler.close()
    assert watched.skipped_count("worker_died") == 0


def test_the_request_a_dying_worker_held_is_skipped_and_the_queued_ones_wait_for_the_next(watched, speech):
    sampler = QualitySampler(1.0, watched, restart_backoff_s=0.01)
    try:
        sampler.offer(_job(np.tile(speech, 6), "held"))  # 34 s: seconds of scoring
        sampler.offer(_job(speech, "queued"))
        os.kill(sampler.worker_pid, signal.SIGKILL)
        watched.wait_for(lambda: watched.scored_ids, "the queued request's score")
    finally:
        sampler.close()
    assert watched.skipped_count("worker_died") == 1 and watched.scored_ids == ["queued"]
    assert watched.value("chorus_dnsmos_worker_deaths_total") == 1


def test_a_worker_that_dies_past_its_restarts_is_reported_down(watched, speech, caplog):
    sampler = QualitySampler(1.0, watched, max_restarts=0)
    try:
        pid = sampler.worker_pid
        os.kill(pid, signal.SIGKILL)
        watched.wait_for(lambda: watched.value("chorus_dnsmos_worker_deaths_total") == 1, "the death")
        assert watched.value("chorus_dnsmos_worker_up") == 0 and sampler.worker_pid is None and _gone(pid)
        sampler.offer(_job(speech))
        assert watched.skipped_count("worker_down") == 1
    finally:
        sampler.close()
    down = [r for r in caplog.records if "scoring is off until the server restarts" in r.getMessage()]
    assert len(down) == 1 and "quality_sample_rate" in down[0].getMessage()


def test_close_leaves_no_worker_process_even_mid_scoring(watched, speech):
    sampler = QualitySampler(1.0, watched)
    pid = sampler.worker_pid
    sampler.offer(_job(np.tile(speech, 6)))
    sampler.close(timeout=0.0)
    assert _gone(pid)


def test_the_worker_process_loads_neither_torch_nor_the_server():
    code = ("import sys; from chorus.quality import worker; from chorus.quality.dnsmos import DNSMOS; DNSMOS(); "
            "bad = [m for m in ('torch', 'chorus.server', 'chorus.audio') if m in sys.modules]; "
            "sys.exit(f'loaded {bad}' if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
