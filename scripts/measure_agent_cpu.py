"""Voice agents against a server of tiny random models on this CPU; print JSON.

    python scripts/measure_agent_cpu.py [--concurrency 4,8] [--repeats 2]
        [--follower-first-window-tokens N] [--vocoder-max-batch-items N] [--out agents.json]

Starts a real server (uvicorn on loopback, tiny random Turbo models, the real pipeline, engine
and vocoder code) and runs ``chorus bench online --agent`` against it in a separate process, as
on a GPU machine (``scripts/gpu/online.sh``). Per level and repeat: first audio p50 / p99 and
what the server added to the text threshold's wait, turns with a stall, audio per second and
the turns' outcomes, cut from the bench's own report. On a CPU the tiny models' vocoder is the
bound as the full-size one is on a GPU, so this is where a scheduling change can be compared
before a GPU run; the absolute figures say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chorus.bench.report import write_report  # noqa: E402
from chorus.server.model_entries import ModelEntry  # noqa: E402
from tests.voices.checkpoints import BASE_ENV  # noqa: E402


def _level_summary(level: dict) -> dict:
    pick = {}
    for name in ("first_audio_s", "server_added_s", "flush_to_last_audio_s"):
        values = level.get(name) or {}
        pick[name] = {k: values.get(k) for k in ("p50", "p99", "max")}
    stalls = level.get("stalls") or {}
    pick["turns"] = level.get("turns")
    pick["turns_with_stall"] = f"{stalls.get('turns_with_stall')} of {stalls.get('turns_measured')}"
    pick["throughput_audio_s_per_s"] = level.get("throughput_audio_s_per_s")
    return pick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--llm-tokens-per-s", type=float, default=50.0)
    parser.add_argument("--follower-first-window-tokens", type=int,
                        help="the server's vocoder_follower_first_window_tokens (default: unset)")
    parser.add_argument("--vocoder-max-batch-items", type=int,
                        help="items per vocoder pass (default: the stage's 32); fewer than the streams in "
                             "flight make the order of passes matter, as on a GPU at 64 agents and more")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault(BASE_ENV, tempfile.mkdtemp(prefix="chorus-agents-"))
    from tests.server.live import LiveServer, server_config, tiny_loader

    most = max(int(c) for c in args.concurrency.split(","))
    runs = []
    with tempfile.TemporaryDirectory() as voices:
        options = {}
        if args.follower_first_window_tokens is not None:
            options["vocoder_follower_first_window_tokens"] = args.follower_first_window_tokens
        if args.vocoder_max_batch_items is not None:
            options["models"] = (ModelEntry(id="chatterbox-turbo", variant="turbo",
                                            vocoder_max_batch_items=args.vocoder_max_batch_items),)
        config = server_config(Path(voices), max_new_tokens=args.max_new_tokens, max_queue=4 * most, **options)
        with LiveServer(config, tiny_loader(config, max_num_seqs=max(16, 4 * most))) as server:
            for repeat in range(args.repeats):
                with tempfile.TemporaryDirectory() as out:
                    report_path = Path(out) / "agent.json"
                    subprocess.run(
                        [sys.executable, "-m", "chorus.cli", "bench", "online", "--agent", "--url", server.url,
                         "--concurrency", args.concurrency, "--turns", str(args.turns),
                         "--llm-tokens-per-s", str(args.llm_tokens_per_s),
                         "--max-new-tokens", str(args.max_new_tokens), "--quiet", "--out", str(report_path)],
                        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                        env={**os.environ, "PYTHONPATH": str(ROOT)})
                    report = json.loads(report_path.read_text())
                runs.append({"repeat": repeat, "levels": {str(level["connections"]): _level_summary(level)
                                                          for level in report["levels"]}})
    write_report({"device": "cpu", "models": "tiny turbo", "concurrency": args.concurrency, "turns": args.turns,
                  "max_new_tokens": args.max_new_tokens, "llm_tokens_per_s": args.llm_tokens_per_s,
                  "follower_first_window_tokens": args.follower_first_window_tokens,
                  "vocoder_max_batch_items": args.vocoder_max_batch_items,
                  "runs": runs}, args.out)


if __name__ == "__main__":
    main()
