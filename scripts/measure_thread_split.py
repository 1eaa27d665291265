"""Two threads doing torch work at once, as the pipeline's T3 and vocoder threads do on a CPU:
each with all of torch's intra-op threads ("shared") against each with its share ("split",
``PipelineConfig.split_cpu_threads``). Trials alternate, so other load on the machine hits both.

    python scripts/measure_thread_split.py --trials 5

Prints the wall seconds of each trial (both threads' fixed work) and the medians as JSON
(docs/engine.md, "Step time").
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    args = parser.parse_args()
    weights, rows = torch.randn(1024, 4096), torch.randn(12, 1024)  # a decode step's MLP matmul
    a, b = torch.randn(256, 1024), torch.randn(1024, 1024)  # dense work on the other thread

    def work(threads: int, fn, count: int) -> None:
        torch.set_num_threads(threads)
        for _ in range(count):
            fn()

    def trial(t3_threads: int, vocoder_threads: int) -> float:
        workers = [threading.Thread(target=work, args=(t3_threads, lambda: rows @ weights, 3000)),
                   threading.Thread(target=work, args=(vocoder_threads, lambda: a @ b, 300))]
        started = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - started

    total = args.threads
    shares = {"shared": (total, total), "split": (max(1, total - total // 2), max(1, total // 2))}
    seconds: dict[str, list[float]] = {name: [] for name in shares}
    for _ in range(args.trials):
        for name, (t3, vocoder) in shares.items():
            seconds[name].append(round(trial(t3, vocoder), 3))
    print(json.dumps({"threads": total, "seconds": seconds,
                      "median": {name: statistics.median(v) for name, v in seconds.items()}}))


if __name__ == "__main__":
    main()
