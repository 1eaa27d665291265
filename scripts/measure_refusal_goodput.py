"""What refusals take from the models' work: the goodput of a busy server while a second client
fires requests it refuses.

    python scripts/measure_refusal_goodput.py --rates 0,100,200 --modes new,keepalive --duration-s 20

A real server (uvicorn with ``chorus serve``'s limits, the HTTP app, the service and the pipeline
over the tiny random models of the tests) runs in a child process with ``admission="queue"`` and
``max_queue`` 16, so low priority may hold 9 requests in flight. This process keeps the engine
busy with ``--busy`` (16) closed-loop clients at high priority, each reading its whole streamed
answer and sending the next; they alone fill more than low priority's share. A second child
process fires low-priority speech requests open-loop at R per second, every one refused 429
(``queue_full``: the same HTTP path, validation and admission call as ``overloaded``), either on
a new connection each (``new``: what an open-loop client with a bounded keep-alive pool does
at overload) or over a pool of 64 kept-alive connections (``keepalive``; more are opened when
all are busy). Per rate and mode: the busy load's completed requests and seconds of audio per
second, the server's CPU (percent of one core), and the refusals' achieved rate and latency
(from their scheduled send time, so the firing client's own lateness counts too), and the
server's event-loop lag and full garbage collections over the window (``server_pauses``, as in
the overload report of ``chorus bench online``).

The model threads' loss is the point: ``goodput_vs_idle`` is the busy load's completions per
second relative to the same run without refusals. On a machine with few cores the two clients
compete with the server for CPU too, so a drop mixes GIL contention inside the server with
plain CPU starvation; compare settings of the server at the same rates rather than reading the
absolute numbers. ``--config key=value`` (repeatable) sets ServerConfig fields of the server.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY_BODY = json.dumps({"model": "chatterbox-turbo", "input": "Hello there, this keeps the engine busy.",
                        "response_format": "pcm"}).encode()
REFUSED_BODY = json.dumps({"model": "chatterbox-turbo", "input": "Hello there, this is a refused request.",
                           "response_format": "pcm"}).encode()
MAX_QUEUE = 16  # low priority may hold int(16 * 0.6) = 9 in flight
KEEPALIVE_POOL = 64  # httpx's default max_keepalive_connections


def _request(body: bytes, priority: str, *, close: bool) -> bytes:
    return (f"POST /v1/audio/speech HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Chorus-Priority: {priority}\r\n"
            + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def config_overrides(pairs: list[str]) -> dict:
    """``key=value`` pairs as ServerConfig fields, converted as ``chorus serve`` converts flags."""
    from chorus.server.config import build_config

    flags = dict(pair.split("=", 1) for pair in pairs)
    config = build_config(flags=flags)
    return {key: getattr(config, key) for key in flags}


# ---- the server ---------------------------------------------------------------------------------

def serve(port: int, voices_dir: str, config_pairs: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from chorus.server.logs import setup_logging
    from chorus.server.main import uvicorn_server
    from chorus.server.registry import ModelRegistry
    from tests.server.live import server_config, tiny_loader

    config = server_config(voices_dir, log_format="json", max_queue=MAX_QUEUE, admission="queue",
                           canary_interval_s=3600.0, **config_overrides(config_pairs))
    setup_logging(config.log_format, config.log_level)
    service = ModelRegistry(config, tiny_loader(config))
    uvicorn_server(service, host="127.0.0.1", port=port, log_level="info").run()


# ---- the refusal client (its own process) ---------------------------------------------------------

async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status == 200:  # admitted after all (the busy load dipped below low priority's share): not read
        return status
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def fire(port: int, rate: float, duration_s: float, mode: str) -> dict:
    request = _request(REFUSED_BODY, "low", close=False)
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    opened = 0

    async def one(scheduled: float) -> None:
        nonlocal errors, opened
        try:
            if mode == "keepalive" and pool:
                reader, writer = pool.pop()
            else:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                opened += 1
            writer.write(request)
            status = await _read_response(reader)
            latencies.append(time.perf_counter() - scheduled)
            statuses[status] = statuses.get(status, 0) + 1
            if mode == "keepalive" and len(pool) < KEEPALIVE_POOL and status != 200:  # (a 200 streams on)
                pool.append((reader, writer))
            else:
                writer.close()
        except (OSError, asyncio.IncompleteReadError, ValueError):
            errors += 1

    tasks = set()
    start = time.perf_counter()
    n = int(rate * duration_s)
    for i in range(n):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    wall = time.perf_counter() - start
    for _, writer in pool:
        writer.close()
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1) if latencies else None

    return {"offered_per_s": rate, "answered_per_s": round(len(latencies) / wall, 1),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, "errors": errors,
            "connections_opened": opened, "latency_ms_p50": pct(0.5), "latency_ms_p99": pct(0.99)}


# ---- the busy load and the harness --------------------------------------------------------------

def _server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _metrics_text(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
    text = (await reader.read(-1)).decode()
    writer.close()
    return text


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def busy_load(port: int, clients: int, stop: asyncio.Event, done: list[float]) -> None:
    request = _request(BUSY_BODY, "high", close=True)

    async def client() -> None:
        while not stop.is_set():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            data = await reader.read(-1)
            writer.close()
            if data.startswith(b"HTTP/1.1 200"):
                done.append(time.perf_counter())

    await asyncio.gather(*(client() for _ in range(clients)))


async def measure(port: int, pid: int, rate: float, mode: str, duration_s: float, busy: int) -> dict:
    from chorus.bench.online_bench import pause_report, server_pauses

    stop, done = asyncio.Event(), []
    load = asyncio.create_task(busy_load(port, busy, stop, done))
    await asyncio.sleep(2.0)  # the busy load reaches its steady state
    metrics0 = await _metrics_text(port)
    cpu0, t0, n0 = _server_cpu_s(pid), time.perf_counter(), len(done)
    firing = None
    if rate > 0:
        firing = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--fire", str(port), "--rate", str(rate), "--duration-s", str(duration_s),
            "--mode", mode, stdout=asyncio.subprocess.PIPE)
        out, _ = await firing.communicate()
        refusals = json.loads(out)
    else:
        await asyncio.sleep(duration_s)
        refusals = None
    wall = time.perf_counter() - t0
    completed, cpu = len(done) - n0, _server_cpu_s(pid) - cpu0
    metrics1 = await _metrics_text(port)
    audio = _metric(metrics1, "chorus_audio_seconds_total") - _metric(metrics0, "chorus_audio_seconds_total")
    stop.set()
    await load
    return {"refusals_per_s": rate, "mode": mode if rate else None, "busy_completed_per_s": round(completed / wall, 2),
            "busy_audio_s_per_s": round(audio / wall, 2), "server_cpu_percent": round(100 * cpu / wall),
            "refusals": refusals,
            # the server's event-loop lag and full garbage collections over the window
            "server_pauses": pause_report(server_pauses(metrics0), server_pauses(metrics1))}


def run(args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = []
    with tempfile.TemporaryDirectory() as voices_dir:
        command = [sys.executable, __file__, "--serve", str(port), "--voices-dir", voices_dir]
        for pair in args.config:
            command += ["--config", pair]
        log = Path(voices_dir, "server.log")
        env = {**os.environ, "CHORUS_TEST_TMP": voices_dir}
        child = subprocess.Popen(command, cwd=ROOT, stderr=log.open("wb"), stdout=subprocess.DEVNULL, env=env)
        try:
            deadline = time.monotonic() + 180
            while True:
                assert child.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                        sock.sendall(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        if sock.recv(64).startswith(b"HTTP/1.1 200"):
                            break
                except OSError:
                    pass
                time.sleep(0.2)
            for _ in range(args.repeats):
                for rate in args.rates:
                    for mode in (args.modes if rate else ["-"]):
                        result = asyncio.run(measure(port, child.pid, rate, mode, args.duration_s, args.busy))
                        print(json.dumps(result), file=sys.stderr)
                        results.append(result)
        finally:
            child.terminate()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    idle = [r["busy_completed_per_s"] for r in results if not r["refusals_per_s"]]
    base = statistics.mean(idle) if idle else None
    for r in results:
        r["goodput_vs_idle"] = round(r["busy_completed_per_s"] / base, 3) if base else None
    return {"config": args.config, "busy_clients": args.busy, "duration_s": args.duration_s,
            "cpus": os.cpu_count(), "runs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="0,100,200", help="comma-separated refusals per second (0: none)")
    parser.add_argument("--modes", default="new,keepalive", help="new (a connection per refusal), keepalive")
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--busy", type=int, default=16, help="closed-loop clients of the busy load")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--config", action="append", default=[], help="a ServerConfig field, key=value")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--voices-dir", help=argparse.SUPPRESS)
    parser.add_argument("--fire", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        return serve(args.serve, args.voices_dir, args.config)
    if args.fire is not None:
        print(json.dumps(asyncio.run(fire(args.fire, args.rate, args.duration_s, args.mode))))
        return
    args.rates = [float(r) for r in args.rates.split(",")]
    args.modes = args.modes.split(",")
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
