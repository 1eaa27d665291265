"""DNSMOS on a sampled share of requests, in a worker process (docs/quality.md, "DNSMOS").

The serving process keeps a bounded queue of ended requests' audio and one feeder thread; the
worker, a child process (``chorus.quality.worker``), loads the model once and scores one clip at
a time. The serving process never runs the model: the feeder resamples a clip to the model's
16 kHz (soxr, outside the GIL), sends it down a pipe and waits; the worker's CPU is its own, at a
lower priority.

A request is offered its audio when it has ended; ``offer`` never blocks: a full queue skips it
(counted). A worker that dies is seen at once (the feeder waits on its pipe too), counted, and
started again after a backoff that doubles while the deaths follow one another without a score
between them; after ``max_restarts`` such restarts the sampler stops and every
later offer is skipped (counted under its own reason).
"""
from __future__ import annotations

import collections
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Protocol

import numpy as np

from chorus.quality.dnsmos import Job, Scores, model_clip, scored_span

logger = logging.getLogger("chorus.server")

# why a sampled request was not scored
SKIP_REASONS = ("queue_full", "worker_died", "worker_down", "failed")
START_TIMEOUT_S = 120.0  # the worker's start: a Python process, onnxruntime and the model file
CHECK_FIX = ("check that chorus-tts[quality] loads (python -c 'from chorus.quality.dnsmos import DNSMOS; "
             "DNSMOS()') and that the host has memory to spare, or set quality_sample_rate to 0")


class Listener(Protocol):
    """Where the sampler's outcomes go (the server's metrics: ``chorus.server.metrics.DnsmosMetrics``)."""

    def scored(self, job: Job, scores: Scores, seconds: float) -> None: ...

    def skipped(self, reason: str) -> None: ...

    def worker_up(self, up: bool) -> None: ...

    def worker_died(self) -> None: ...


class WorkerDied(Exception):
    """The worker process ended (or never became ready); the message says how."""


class _Worker:
    """One worker process (``python -m chorus.quality.worker``) and the server's end of its pipe.
    A plain subprocess, not multiprocessing's spawn: that would run the server's main script
    again in the worker."""

    def __init__(self, threads: int):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # where this chorus is imported from
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "chorus.quality.worker", str(theirs.fileno()),
                                             str(threads)], pass_fds=(theirs.fileno(),), env=env,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            theirs.close()  # the worker's end lives in the worker only: its death reads as the pipe's end
        self.conn = Connection(ours.detach())

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise WorkerDied(f"it did not load the model within {timeout:g} s")
        reply = self._receive()
        if reply[0] != "ready":
            raise WorkerDied(reply[1])

    def score(self, clip: np.ndarray) -> tuple[Scores, float] | str:
        """The clip's scores and scoring time, or why scoring it failed (raises ``WorkerDied``)."""
        try:
            self.conn.send_bytes(np.ascontiguousarray(clip, np.float32))
        except OSError:
            raise WorkerDied(self.ended()) from None
        reply = self._receive()
        return reply[1] if reply[0] == "error" else (reply[1], reply[2])

    def _receive(self) -> tuple:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise WorkerDied(self.ended()) from None

    def ended(self) -> str:
        """How the process ended (waits up to 5 s for it to)."""
        try:
            code = self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            return "its pipe closed"
        if code < 0:
            name = signal.Signals(-code).name
            why = " (as the out-of-memory killer does)" if name == "SIGKILL" else ""
            return f"it was killed by {name}{why}"
        return f"it exited with code {code}"

    def stop(self, timeout: float = 5.0) -> None:
        """Ask it to exit, kill it if it does not within ``timeout``; it is reaped either way."""
        if self.process.poll() is None:
            try:
                self.conn.send_bytes(b"")
            except OSError:
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()
        self.conn.close()


class QualitySampler:
    """Scores a sampled share of requests in one worker process behind a queue of ``capacity``
    requests (and the one being scored). The constructor starts the worker and waits until it
    has loaded the model (a failure raises ``RuntimeError``); :meth:`close` stops it."""

    def __init__(self, rate: float, listener: Listener, *, capacity: int = 8, threads: int = 1,
                 restart_backoff_s: float = 1.0, max_restarts: int = 3, rng: random.Random | None = None):
        self.rate, self.capacity = rate, capacity
        self._listener = listener
        self._threads, self._backoff_s, self._max_restarts = threads, restart_backoff_s, max_restarts
        self._rng = rng or random.Random()
        self._worker: _Worker | None = self._start()
        self._jobs: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()  # an offer wakes the feeder (which also waits on the worker)
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closing = threading.Event()
        self._down = False  # it stopped restarting the worker
        self._deaths = 0  # deaths since the last score
        self._thread = threading.Thread(target=self._run, name="chorus-dnsmos-feeder", daemon=True)
        self._thread.start()

    @property
    def worker_pid(self) -> int | None:
        """The running worker's process id (None while it is down)."""
        worker = self._worker
        return worker.process.pid if worker is not None else None

    def sampled(self) -> bool:
        """Whether the next request is scored (drawn per request)."""
        return self._rng.random() < self.rate

    def offer(self, job: Job) -> None:
        """Queue an ended request's audio for scoring; never blocks (skipped and counted when the
        queue is full or the worker is down)."""
        if self._closing.is_set():
            return
        if self._down:
            self._listener.skipped("worker_down")
            return
        span = scored_span(job.wav, job.sample_rate)
        if span.size < job.wav.size:  # hold only what is scored, not a long request's whole audio
            job = replace(job, wav=span.copy())
        with self._lock:
            full = len(self._jobs) >= self.capacity
            if not full:
                self._jobs.append(job)
        if full:
            self._listener.skipped("queue_full")
            return
        self._wake()

    def close(self, timeout: float = 5.0) -> None:
        """Stop: jobs still queued are dropped, the one being scored gets ``timeout`` seconds to
        finish, then the worker is killed; the worker process is reaped before this returns."""
        self._closing.set()
        with self._lock:
            self._jobs.clear()
        self._wake()
        self._thread.join(timeout)
        worker = self._worker
        if self._thread.is_alive() and worker is not None:
            worker.process.kill()  # mid-scoring: the feeder reads the pipe's end and stops it
        self._thread.join()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # wake-ups already pending (the buffer is full), or closed
            pass

    def _start(self) -> _Worker:
        try:
            worker = _Worker(self._threads)
        except OSError as exc:
            raise RuntimeError(f"the DNSMOS worker did not start: {exc}; {CHECK_FIX}") from None
        try:
            worker.wait_ready(START_TIMEOUT_S)
        except WorkerDied as exc:
            worker.stop()
            raise RuntimeError(f"the DNSMOS worker did not start: {exc}; {CHECK_FIX}") from None
        self._listener.worker_up(True)
        return worker

    def _run(self) -> None:
        """The feeder: wait for an offer, the worker's death or the close; score what is queued."""
        try:
            while not self._closing.is_set():
                worker = self._worker
                if worker is None:  # dead: start another after the backoff (unless closing or down)
                    if self._down or self._closing.wait(self._delay()):
                        break
                    self._restart()
                    continue
                job = self._pop()
                if job is not None:  # queued ones first (also those that waited for a restarted worker)
                    self._score(job)
                    continue
                ready = wait([self._wake_r, worker.conn])  # the worker says nothing unasked: its end
                if self._wake_r in ready:
                    self._drain_wakes()
                elif not self._closing.is_set():
                    self._lose_worker(None, f"the DNSMOS worker process died while idle: {worker.ended()}")
        finally:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def _pop(self) -> Job | None:
        with self._lock:
            return self._jobs.popleft() if self._jobs else None

    def _drain_wakes(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _score(self, job: Job) -> None:
        try:
            result = self._worker.score(model_clip(job.wav, job.sample_rate))
        except WorkerDied as exc:
            if not self._closing.is_set():
                self._listener.skipped("worker_died")
                self._lose_worker(job, f"the DNSMOS worker process died while scoring a request: {exc}")
            return
        except Exception:  # noqa: BLE001 - the feeder must not die
            logger.exception("DNSMOS scoring failed", extra={"request_id": job.request_id})
            self._listener.skipped("failed")
            return
        if isinstance(result, str):
            logger.warning("DNSMOS could not score the request: %s", result, extra={"request_id": job.request_id})
            self._listener.skipped("failed")
            return
        self._deaths = 0
        scores, seconds = result
        self._listener.scored(job, scores, seconds)

    def _restart(self) -> None:
        """Start a new worker (a failure to start counts as another death)."""
        try:
            self._worker = _Worker(self._threads)  # set first: close() kills it if it hangs starting
            self._worker.wait_ready(START_TIMEOUT_S)
        except (WorkerDied, OSError) as exc:
            if self._closing.is_set():
                return
            self._lose_worker(None, f"the restarted DNSMOS worker did not start: {exc}")
            return
        logger.info("the DNSMOS worker process is running again")
        self._listener.worker_up(True)

    def _lose_worker(self, job: Job | None, why: str) -> None:
        """The worker is gone: reap it, count it, and restart it later or stop for good."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._deaths += 1
        self._down = self._deaths > self._max_restarts
        if self._down:
            with self._lock:
                dropped, self._jobs = len(self._jobs), collections.deque()
        self._listener.worker_died()
        self._listener.worker_up(False)
        extra = {"request_id": job.request_id} if job is not None else {}
        if not self._down:
            logger.warning("%s; restarting it in %g s (restart %d of at most %d in a row)", why, self._delay(),
                           self._deaths, self._max_restarts, extra=extra)
            return
        for _ in range(dropped):
            self._listener.skipped("worker_down")
        logger.error("%s (%d deaths in a row): DNSMOS scoring is off until the server restarts (sampled requests "
                     "count as skipped, reason worker_down); %s", why, self._deaths, CHECK_FIX, extra=extra)

    def _delay(self) -> float:
        return self._backoff_s * 2 ** (self._deaths - 1)
