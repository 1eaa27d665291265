"""The server's CPU time per refused speech request: what each 429 takes from the model threads
(one process, one GIL) when an overloaded server refuses most of what it is offered.

    python scripts/measure_refusal_cost.py --in-flight 1,64,256 --requests 2000

For each in-flight count, a real server (uvicorn with ``chorus serve``'s limits, the HTTP app, the
service and the pipeline over the tiny random models of the tests) runs in a child process. Once
it is ready, the harness takes ``--in-flight`` admission tickets (requests in flight, their T3
rows filling the batch, nothing delivered yet: what a queue of admitted work looks like to
admission) and lowers the start deadline so that every new speech request is refused with 429
``overloaded``. This process then sends ``--requests`` refused POST /v1/audio/speech over one
keep-alive connection and reads the server's CPU seconds (user + system, all threads, and the
event-loop thread alone) around them; the same wait with no requests is the idle baseline
subtracted. Prints JSON: microseconds of server CPU per refusal, per in-flight count.
``--profile FILE`` writes a cProfile (in thread CPU time) of the event-loop thread (the last in-flight count) for
``python -m pstats``. ``--config key=value`` (repeatable) sets a ServerConfig field of the server,
e.g. ``--config http_parser=h11`` to compare the parsers.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "chatterbox-turbo", "input": "Hello there, this is a refused request.", "response_format": "pcm"}


def serve(port: int, in_flight: int, voices_dir: str, profile: str | None, config_pairs: list[str]) -> None:
    """The child: a server that refuses every speech request once ``in_flight`` tickets are held."""
    sys.path.insert(0, str(ROOT))
    from chorus.engine.request import Priority
    from chorus.server.logs import setup_logging
    from chorus.server.main import uvicorn_server
    from chorus.server.registry import ModelRegistry
    from tests.server.live import server_config, tiny_loader
    from measure_refusal_goodput import config_overrides

    config = server_config(voices_dir, log_format="json", max_queue=max(in_flight + 64, 256),
                           canary_interval_s=3600.0, **config_overrides(config_pairs))
    setup_logging(config.log_format, config.log_level)
    registry = ModelRegistry(config, tiny_loader(config))
    server = uvicorn_server(registry, host="127.0.0.1", port=port, log_level="info")
    service = registry.versions()[0].service

    def occupy() -> None:
        while registry.state != "ready":
            time.sleep(0.05)
        tickets = [service.admission.admit(Priority.HIGH, tokens=200.0, chars=120, start_deadline_s=3600.0,
                                           queue_limit=config.max_queue, kv_usage=0.0, waiting=0, rows=2)
                   for _ in range(in_flight)]  # admitted work: 2 rows each (CFG), so the T3 batch is full
        service.start_deadline_s = 1e-6  # nothing can start in time: every request is refused
        Path(voices_dir, "occupied").touch()
        while not Path(voices_dir, "stop").exists():
            time.sleep(0.05)
        for ticket in tickets:
            service.admission.release(ticket)
        server.should_exit = True  # (a signal would end the process before the profile is written)

    threading.Thread(target=occupy, daemon=True).start()
    if profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # CPU time: waits for the GIL or the CPU are not counted
        profiler.runcall(server.run)
        profiler.dump_stats(profile)
    else:
        server.run()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(all threads, the main thread: the event loop) user + system CPU seconds of ``pid``."""
    tick = os.sysconf("SC_CLK_TCK")

    def read(path: str) -> float:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return read(f"/proc/{pid}/stat"), read(f"/proc/{pid}/task/{pid}/stat")


def measure(in_flight: int, requests: int, profile: str | None, config_pairs: list[str]) -> dict:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as voices_dir:
        command = [sys.executable, __file__, "--serve", str(port), "--in-flight", str(in_flight),
                   "--voices-dir", voices_dir] + (["--profile", profile] if profile else [])
        for pair in config_pairs:
            command += ["--config", pair]
        log = Path(voices_dir, "server.log")
        env = {**os.environ, "CHORUS_TEST_TMP": voices_dir}  # where the tiny models' checkpoints go
        child = subprocess.Popen(command, cwd=ROOT, stderr=log.open("wb"), stdout=subprocess.DEVNULL, env=env)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                deadline = time.monotonic() + 180
                while not Path(voices_dir, "occupied").exists():
                    failed = child.poll() is not None or b"start-up failed" in log.read_bytes()
                    assert not failed and time.monotonic() < deadline, f"the server did not start: {log.read_text()}"
                    time.sleep(0.1)
                time.sleep(1.0)  # let start-up settle
                first = client.post("/v1/audio/speech", json=BODY)
                assert first.status_code == 429 and first.json()["error"]["code"] == "overloaded", first.text
                for _ in range(50):  # warm the path
                    client.post("/v1/audio/speech", json=BODY)
                started, (cpu0, loop0) = time.perf_counter(), cpu_seconds(child.pid)
                for _ in range(requests):
                    response = client.post("/v1/audio/speech", json=BODY)
                    assert response.status_code == 429
                wall = time.perf_counter() - started
                cpu1, loop1 = cpu_seconds(child.pid)
                time.sleep(wall)  # the same time idle: the monitor and threads' own cost
                cpu2, loop2 = cpu_seconds(child.pid)
        finally:
            Path(voices_dir, "stop").touch()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            lines = log.read_bytes().count(b'"status": 429')
    per = 1e6 / requests
    return {"in_flight": in_flight, "requests": requests, "wall_s": round(wall, 3),
            "client_requests_per_s": round(requests / wall, 1),
            "cpu_us_per_refusal": round(((cpu1 - cpu0) - (cpu2 - cpu1)) * per, 1),
            "loop_thread_cpu_us_per_refusal": round(((loop1 - loop0) - (loop2 - loop1)) * per, 1),
            "idle_cpu_s": round(cpu2 - cpu1, 3), "access_lines_429": lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-flight", default="1,64,256", help="comma-separated counts of requests in flight (at least 1: a request that finds "
                        "nothing in flight is always admitted)")
    parser.add_argument("--requests", type=int, default=2000, help="refused requests per count")
    parser.add_argument("--profile", help="write a cProfile of the server's event-loop thread here")
    parser.add_argument("--config", action="append", default=[], help="a ServerConfig field of the server, key=value "
                        "(repeatable), e.g. http_parser=h11")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--voices-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        return serve(args.serve, int(args.in_flight), args.voices_dir, args.profile, args.config)
    counts = [int(c) for c in args.in_flight.split(",")]
    results = [measure(n, args.requests, args.profile if n == counts[-1] else None, args.config) for n in counts]
    print(json.dumps({"config": args.config, "refusals": results}, indent=2))


if __name__ == "__main__":
    main()
