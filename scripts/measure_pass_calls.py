"""Tensor calls the vocoder stage makes from Python per stream added and per streaming pass; print JSON.

    python scripts/measure_pass_calls.py [--streams 32] [--variant turbo] [--out calls.json]

Every tensor call (a torch function or a tensor method, indexing included) releases the GIL
and takes it again, so on a serving process, where T3's thread runs a busy host loop beside the
vocoder thread, each call can wait for the GIL (docs/vocoder.md, "Streams' noise", measured
on an H200). This counts them, by name, on a tiny random-weight model on the CPU (the count
does not depend on the device or the model's size, only on the stage's host code): for
``--streams`` streams added at once, each pushed past its first window, then for the pass of
their first windows and the pass of their second windows. Model calls count once each on a
GPU (graph replays) but here run eagerly, so the calls inside the pass's two model calls
(``PassGraphs.run_flow`` and ``run_hift``) are counted apart (``model_calls``) and left out of
``host_calls``; ``by_site`` splits ``host_calls`` by the chorus function that made them. The
noise-tape reads counted here are the PyTorch path's (the CPU's); on CUDA each read is one
Triton kernel instead (docs/vocoder.md, "A pass's host work").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.bench.report import write_report  # noqa: E402
from chorus.vocoder import VocoderConfig, VocoderStage  # noqa: E402
from tests.vocoder.models import random_s3gen, random_tokens, random_voice  # noqa: E402
from tests.vocoder.tensor_calls import TensorCalls  # noqa: E402


def _report(counter: TensorCalls, per: int) -> dict:
    total = counter.host_total
    return {"host_calls": total, "host_calls_per_stream": round(total / per, 1), "model_calls": counter.model,
            "attribute_reads": counter.attribute_reads, "by_site": dict(counter.sites.most_common()),
            "top": dict(counter.host.most_common(12))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--variant", default="turbo", choices=["turbo", "original"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    s3gen = random_s3gen(args.variant, seed=3)
    config = VocoderConfig()
    stage = VocoderStage(s3gen, config)
    voice, n = random_voice(30, seed=1), args.streams
    first_end = config.first_window_tokens + config.holdback_tokens + 1
    second_end = first_end + config.next_window(config.first_window_tokens)
    tokens = [random_tokens(second_end, seed=10 + i) for i in range(n)]
    stage.add("warm", voice, seed=99, streaming=True)  # the voice cache and first-use costs
    stage.push("warm", tokens[0], final=True)
    while stage.has_work():
        stage.step()

    counter = TensorCalls.for_passes(stage)
    report = {"variant": args.variant, "streams": n, "voice_prompt_tokens": 30}
    with counter:
        for i in range(n):
            stage.add(f"s{i}", voice, seed=i, streaming=True)
    report["add"] = _report(counter, n)
    pushed = 0
    for name, end in (("first_window_pass", first_end), ("second_window_pass", second_end)):
        for i in range(n):
            stage.push(f"s{i}", tokens[i][pushed:end])
        pushed = end
        counter.clear()
        with counter:
            pieces = stage.step()
        assert len(pieces) == n, (name, len(pieces))
        report[name] = _report(counter, n)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
