"""A Ray driver in a child process, so that pytest's own process never initialises Ray.

``ray.shutdown()`` leaves the threads of the native runtimes inside Ray's ``_raylet.so`` running,
and Ray has no call that stops them: a process that was Ray's driver is one to throw away. The
Ray Serve tests therefore run their cluster in a :class:`Child` process, started with the
``spawn`` context (a fresh interpreter: nothing of pytest's process, its threads above all, is
copied into it), which holds a context (e.g. ``ray_cluster.serve_cluster``) open and runs the
tests' scenarios in it, one call at a time. Scenarios are module-level functions (the child
imports them by name) that make their own assertions; a failing one fails its test with the
child's traceback.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import traceback
from multiprocessing.connection import wait

import pytest

_SPAWN = multiprocessing.get_context("spawn")
_NOTHING = object()  # a call that sends nothing: the first answer (the context entered)


def _serve(conn, context, args, kwargs) -> None:
    """The child's main: enter ``context(*args, **kwargs)``, answer each call ``(fn, args)`` with
    ``fn(value, *args)`` until told to stop (None), leave the context."""
    os.setpgid(0, 0)  # a process group of its own and of everything it starts: a timeout kills them all
    try:
        with context(*args, **kwargs) as value:
            conn.send(("ok", None))
            while (call := conn.recv()) is not None:
                fn, fn_args = call
                try:
                    conn.send(("ok", fn(value, *fn_args)))
                except BaseException:
                    conn.send(("failed", traceback.format_exc()))
        conn.send(("ok", None))
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
    finally:
        # Everything is reported and the context is left (Ray shut down): end the process without
        # the C++ static destructors that a normal exit runs under Ray's leftover native threads
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class Child:
    """``with Child(context, *args, timeout_s=..., **kwargs) as child``: a spawned process that has
    entered ``context(*args, **kwargs)`` within ``timeout_s``; ``child.run(fn, *args, timeout_s=...)``
    returns ``fn(value, *args)`` run there (``value``: what the context yielded). A call that fails
    in the child fails the test with the child's traceback; a child that dies without an answer
    fails it with its exit status; a call without an answer within its ``timeout_s`` kills the
    child's process group and fails the test. After a death or a timeout every later call fails."""

    def __init__(self, context, *args, timeout_s: float, **kwargs):
        self._start = (context, args, kwargs)
        self._start_timeout_s = timeout_s
        self._gone: str | None = None  # why the child can no longer answer

    def __enter__(self) -> Child:
        self._conn, child_conn = _SPAWN.Pipe()
        context, args, kwargs = self._start
        self._process = _SPAWN.Process(target=_serve, args=(child_conn, context, args, kwargs), name="ray-driver")
        self._process.start()
        child_conn.close()
        try:
            self._call(f"entering {context.__name__}", self._start_timeout_s)
        except BaseException:
            self._end()
            raise
        return self

    def run(self, fn, *args, timeout_s: float):
        return self._call(fn.__name__, timeout_s, (fn, args))

    def __exit__(self, *exc) -> None:
        try:
            if self._gone is None:
                self._call("leaving the context", timeout_s=120, message=None)
        finally:
            self._end()

    def _call(self, what: str, timeout_s: float, message=_NOTHING):
        """Send ``message`` (None: leave the context and end) and return the child's answer, or
        fail the test."""
        if self._gone is not None:
            pytest.fail(f"{what}: the Ray driver's child process is gone ({self._gone})", pytrace=False)
        try:
            if message is not _NOTHING:
                self._conn.send(message)
            if not wait([self._conn, self._process.sentinel], timeout_s):
                self._kill(f"{what} timed out")
                pytest.fail(f"{what}: no answer from the Ray driver's child process within {timeout_s} s; "
                            "killed it and its process group", pytrace=False)
            kind, value = self._conn.recv()
        except EOFError:
            self._kill(f"it died during {what}")
            code = self._process.exitcode
            died = f"of signal {signal.Signals(-code).name}" if code < 0 else f"with exit status {code}"
            pytest.fail(f"{what}: the Ray driver's child process died {died} without answering", pytrace=False)
        except BaseException:
            # interrupted (pytest-timeout, Ctrl-C) before the answer: the child is still busy with
            # this call, and its answer would be taken for the next call's
            if self._gone is None:
                self._kill(f"{what} was interrupted")
            raise
        if kind == "failed":
            pytest.fail(f"{what} failed in the Ray driver's child process:\n{value}", pytrace=False)
        return value

    def _end(self) -> None:
        if self._gone is None:
            self._process.join(30)  # it ends itself once it has answered the last message
            if self._process.exitcode is None:
                self._kill("it did not end")
        self._conn.close()

    def _kill(self, why: str) -> None:
        """Kill the child's process group (Ray's processes with it), and the child itself in case it
        had not made its group yet, then reap it. Only before the child is reaped: until then its
        pid, which names the group, cannot be reused."""
        self._gone = why
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.kill()
        self._process.join()
