"""The DNSMOS worker process (``python -m chorus.quality.worker FD THREADS``, started by
``chorus.quality.sampler``): loads the model once, then scores the clips the server sends over
the connection on file descriptor FD. It imports numpy, onnxruntime and the model's module,
nothing of the server."""
from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

NICE = 10  # below the server's CPU priority: when cores are short, scoring yields to serving


def serve(conn: Connection, threads: int) -> int:
    """Answer ``("ready",)`` once the model is loaded, then each clip received (float32 bytes at
    16 kHz) with ``("scores", Scores, seconds)`` or ``("error", why)``, until an empty message
    or the end of the connection (the server is gone). Returns the exit code."""
    from chorus.quality.dnsmos import DNSMOS

    try:
        scorer = DNSMOS(threads)
    except Exception as exc:  # noqa: BLE001 - told to the server, which logs it
        conn.send(("error", f"loading the model failed: {type(exc).__name__}: {exc}"))
        return 1
    try:
        conn.send(("ready",))
        while data := conn.recv_bytes():
            started = time.perf_counter()
            try:
                scores = scorer.score_clip(np.frombuffer(data, np.float32))
            except Exception as exc:  # noqa: BLE001 - one clip's failure, told to the server
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
                continue
            conn.send(("scores", scores, time.perf_counter() - started))
    except (EOFError, OSError):  # the server is gone
        pass
    return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server stops it
    if hasattr(os, "nice"):
        os.nice(NICE)
    fd, threads = int(argv[0]), int(argv[1])
    return serve(Connection(fd), threads)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
