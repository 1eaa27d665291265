"""The processes that send a load test's requests (``--client-processes``): each spawned with its
own event loop and connections, so one busy client loop's lag does not add to the latencies it
measures; what each sent and its loop's lag go into the report."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import time

from chorus.bench.online_bench import Outcome, _pct


def lag_summary(lag: list[float]) -> dict:
    """Event-loop lag samples in a report: how many, p50, p99 and max (seconds)."""
    return {"samples": len(lag), "p50": _pct(lag, 50), "p99": _pct(lag, 99), "max": _pct(lag, 100)}


def sender_summary(pid: int, outcomes: list[Outcome], lag: list[float]) -> dict:
    """One client process in the report: its pid, the requests it sent, its loop's lag."""
    return {"pid": pid, "requests": len(outcomes),
            "loop_lag_s": {"samples": len(lag), "p99": _pct(lag, 99), "max": _pct(lag, 100)}}


def _client_process_main(conn, work, args: tuple) -> None:
    """A client process: say it is ready (its imports done), take the start as a wall-clock time,
    run ``work(*args, begin)`` on its own loop, hand back ``(its pid, *what work returned)`` or
    the error that stopped it."""
    try:
        conn.send("ready")
        start_epoch = conn.recv()
        begin = time.perf_counter() + (start_epoch - time.time())
        conn.send((os.getpid(), *asyncio.run(work(*args, begin))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(RuntimeError(f"a bench client process failed: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class ClientProcesses:
    """One spawned process per entry of ``shards`` (none inherits this process's threads or
    loop), each running ``await work(*shard, begin)`` (a module-level coroutine function that
    returns ``(outcomes, lag samples)``); :meth:`start` returns once every one has imported what
    it needs, so the first request is not late by a process start."""

    def __init__(self, name: str, work, shards: list[tuple]):
        context = multiprocessing.get_context("spawn")
        self._pipes, self._children = [], []
        for k, shard in enumerate(shards):
            parent_end, child_end = context.Pipe()
            child = context.Process(target=_client_process_main, args=(child_end, work, shard),
                                    daemon=True, name=f"bench-{name}-client-{k}")
            self._pipes.append(parent_end)
            self._children.append(child)

    def start(self) -> None:
        for child in self._children:
            child.start()
        for pipe, child in zip(self._pipes, self._children):
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError(f"{child.name} did not start within 120 s")

    async def run(self, begin: float) -> tuple[list[list[Outcome]], list[float], list[dict]]:
        """Start every process's work at ``begin`` (this process's ``perf_counter``); its
        outcomes per process (in ``shards`` order), every process's lag samples, and what each
        sent (:func:`sender_summary`)."""
        start_epoch = time.time() + (begin - time.perf_counter())
        for pipe in self._pipes:
            pipe.send(start_epoch)
        loop = asyncio.get_running_loop()
        answers = [await loop.run_in_executor(None, pipe.recv) for pipe in self._pipes]
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return ([shard for _, shard, _ in answers], [lag for _, _, lags in answers for lag in lags],
                [sender_summary(pid, shard, lags) for pid, shard, lags in answers])

    def close(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        for child in self._children:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
                child.join()
