"""What each stage thread of a server was doing, from py-spy's collapsed stacks (``py-spy record
--threads --idle --format raw``, as ``device_checks.sh agent-turbo-profile`` takes them); JSON.

    python scripts/gpu/summarize_pyspy.py agent_profile/pyspy.txt --out profile.json

A sample is put in the first class (in the order below) whose marker is in its stack. Samples
of a thread waiting for work are ``idle``; the shares of ``busy`` are of the other samples.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

CLASSES = {
    "chorus-t3-engine": (
        ("idle", ("Queue.get",)),
        ("waiting for the step on the device (collect)", ("ModelRunner.collect",)),
        ("an admitting step's eager forward", ("GPT2Backbone.forward", "Llama", "T3Model.forward")),
        ("a decode step's graph replay", ("StepGraphs._run_decode",)),
        ("an admitting step's graph replay", ("StepGraphs.run", "lay_out_mixed")),
        ("sampling: loading a new batch composition", ("SamplerGraphs.load", "_hand_back", "SamplingBatch.build")),
        ("sampling", ("SamplerGraphs", "sample")),
        ("a step's inputs (prepare)", ("ModelRunner.prepare",)),
        ("launching a step (the rest)", ("ModelRunner.launch", "T3Engine._launch")),
        ("admissions (prompt embeddings, queueing)", ("add_requests",)),
        ("scheduling", ("schedule",)),
        ("committing a step", ("_commit", "update_from_output")),
    ),
    "chorus-vocoder": (
        ("idle", ("Queue.get",)),
        ("a pass: waiting for the flow's frames (host copy)", ("gather_frames",)),
        ("a pass: graph replays", ("CUDAGraph.replay",)),
        ("a pass: the rest", ("VocoderStage.step", "VocoderStage._run_pass")),
        ("new streams (noise tapes)", ("new_stream", "NoiseTape")),
        ("requests' bookkeeping", ("Pipeline._apply", "Pipeline._push", "Pipeline._complete", "Pipeline._drain")),
    ),
}


def classify(stack: str, classes) -> str:
    for name, markers in classes:
        if any(marker in stack for marker in markers):
            return name
    return "other"


def summarize(path: Path) -> dict:
    counts = {thread: Counter() for thread in CLASSES}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        head = stack.split(";", 1)[0]
        for thread, classes in CLASSES.items():
            if thread in head:
                counts[thread][classify(stack, classes)] += int(n)
    report = {}
    for thread, counter in counts.items():
        total = sum(counter.values())
        busy = total - counter["idle"]
        report[thread] = {"samples": total, "idle_share": round(counter["idle"] / total, 3) if total else None,
                          "busy_shares": {name: round(n / busy, 3) for name, n in counter.most_common()
                                          if name != "idle" and busy}}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", type=Path, help="py-spy's raw output")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = json.dumps(summarize(args.stacks), indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
