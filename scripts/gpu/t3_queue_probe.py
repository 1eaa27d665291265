"""Where a T3 request's time goes between the pipeline's submit and its first token, in a live
server: a diagnostic that wraps private methods of the engine and the pipeline, not a metric.

    CHORUS_PROBE_OUT=DIR PYTHONPATH=scripts/gpu/probe:$PYTHONPATH chorus serve ...
    python scripts/gpu/t3_queue_probe.py summarize DIR --out probe.json

With ``CHORUS_PROBE_OUT`` set, ``scripts/gpu/probe/sitecustomize.py`` calls :func:`install` in
every Python process started with that directory on its path; a process that runs T3 then writes
``DIR/probe_<pid>.json`` every 5 s and at exit. Per request (a pipeline chunk, a voice-agent
piece), monotonic stamps of:

- ``submit``: ``AsyncT3Engine.submit`` (the pipeline hands the request to T3's thread);
- ``applied``: T3's thread takes it from its command queue (``AsyncT3Engine._apply``);
- ``enter``: it enters the scheduler's queue (``Scheduler.add_request``, after the prompt
  embeddings of its burst were made);
- ``admit``: a step is scheduled with it (``Scheduler._add_running``), ``ahead`` saying whether
  that was a step scheduled ahead (``schedule_ahead``);
- ``first``: the pipeline receives its first token (``Pipeline._on_t3_step``).

Per engine step, its start, wall seconds, whether it computed prompt positions, and whether a
step was left queued ahead. The wrappers add Python work on T3's thread (a few microseconds a
request and a step), so compare phases within one run, not its totals with an unprobed run.
``summarize`` cuts a file's requests into runs at gaps of ``--gap-s`` in their submissions (a
bench's warm-up and levels) and gives each phase's percentiles per run.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import threading
import time
from pathlib import Path

PHASES = (("applied", "submit"), ("enter", "applied"), ("admit", "enter"), ("first", "admit"), ("first", "submit"))


def install(out_dir: str) -> None:
    """Wrap the engine's and the pipeline's methods to stamp every request (see the module docstring)."""
    from chorus.engine import async_engine, engine, scheduler
    from chorus.pipeline import pipeline

    requests: dict[str, dict] = {}
    steps: list[tuple] = []
    local = threading.local()
    now = time.monotonic

    def wrap(cls, name, before=None, after=None):
        original = getattr(cls, name)

        def wrapped(self, *args, **kwargs):
            started = now()
            if before is not None:
                before(self, started, *args, **kwargs)
            result = original(self, *args, **kwargs)
            if after is not None:
                after(self, started, result, *args, **kwargs)
            return result
        setattr(cls, name, wrapped)

    def stamp(request_id: str, key: str, value) -> None:
        requests.setdefault(request_id, {}).setdefault(key, value)

    def on_submit(self, at, batch):
        for request in batch:
            stamp(request.request_id, "submit", at)

    def on_apply(self, at, commands):
        for command, payload in commands:
            if command == "add_many":
                for request in payload:
                    stamp(request.request_id, "applied", at)

    def on_admit(self, at, result, request):
        entry = requests.setdefault(request.request_id, {})
        if "admit" not in entry:
            entry.update(admit=at, ahead=getattr(local, "ahead", False), step=len(steps))

    def on_step(self, at, result):
        steps.append((round(at, 5), round(now() - at, 5), bool(self.last_step_prefilled), self._ahead is not None))

    def on_events(self, at, result, events):
        for event in events:
            entry = requests.get(event.request_id)
            if event.new_token is not None and entry is not None and "first" not in entry:
                entry.update(first=at, first_step=len(steps))

    wrap(async_engine.AsyncT3Engine, "submit", before=on_submit)
    wrap(async_engine.AsyncT3Engine, "_apply", before=on_apply)
    wrap(scheduler.Scheduler, "add_request", before=lambda self, at, request: stamp(request.request_id, "enter", at))
    wrap(scheduler.Scheduler, "_add_running", after=on_admit)
    wrap(scheduler.Scheduler, "schedule_ahead", before=lambda self, at: setattr(local, "ahead", True),
         after=lambda self, at, result: setattr(local, "ahead", False))
    wrap(engine.T3Engine, "step", after=on_step)
    wrap(pipeline.Pipeline, "_on_t3_step", after=on_events)

    path = Path(out_dir) / f"probe_{os.getpid()}.json"

    def dump() -> None:
        if requests:
            path.write_text(json.dumps({"requests": dict(requests), "steps": list(steps)}))

    def every_5_s() -> None:
        while True:
            time.sleep(5)
            try:
                dump()
            except Exception:  # noqa: BLE001 - a diagnostic must not take the server down
                pass

    atexit.register(dump)
    threading.Thread(target=every_5_s, name="t3-queue-probe", daemon=True).start()


def _percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)  # noqa: E731
    return {"p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "max_ms": pick(1.0)}


def _median(values: list[int]) -> int | None:
    return sorted(values)[len(values) // 2] if values else None


def summarize(path: Path, gap_s: float) -> list[dict]:
    data = json.loads(path.read_text())
    done = sorted((r for r in data["requests"].values() if "first" in r and "submit" in r), key=lambda r: r["submit"])
    runs, current = [], []
    for request in done:
        if current and request["submit"] - current[-1]["submit"] > gap_s:
            runs.append(current)
            current = []
        current.append(request)
    if current:
        runs.append(current)
    steps = data["steps"]
    summary = []
    for run in runs:
        start, end = run[0]["submit"], max(r["first"] for r in run)
        inside = [s for s in steps if start <= s[0] <= end]
        summary.append({
            "requests": len(run), "span_s": round(end - start, 3),
            "phases": {f"{a}-{b}": _percentiles([r[a] - r[b] for r in run if a in r and b in r]) for a, b in PHASES},
            "admitted_ahead_share": round(sum(bool(r.get("ahead")) for r in run) / len(run), 3),
            "steps_admit_to_first_p50": _median([r["first_step"] - r["step"] for r in run if "step" in r]),
            "steps": {"count": len(inside), "prefill": sum(1 for s in inside if s[2]),
                      "mean_ms": round(1000 * sum(s[1] for s in inside) / max(1, len(inside)), 2),
                      "prefill_mean_ms": round(1000 * sum(s[1] for s in inside if s[2]) / max(1, sum(1 for s in inside if s[2])), 2)},
        })
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summarize", help="per run, each phase's percentiles, from a directory of probe files")
    p.add_argument("directory", type=Path)
    p.add_argument("--gap-s", type=float, default=0.8, help="a gap in submissions this long starts a new run")
    p.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {path.name: summarize(path, args.gap_s) for path in sorted(args.directory.glob("probe_*.json"))}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
