"""Streamed vs one-pass audio of the vocoder stage on random-weight S3Gen models.

For each variant and stage configuration, one job's tokens are pushed in pieces of odd sizes
(the stream) and, to a second stage, all at once (one pass, same seed and noise); prints and
writes JSON with the SNR of the stream against the one pass, the largest sample step near piece
boundaries against the largest elsewhere, and the length check.

    python scripts/measure_vocoder_streaming.py --out vocoder_streaming.json [--fullsize]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.vocoder import VocoderConfig, VocoderStage  # noqa: E402
from chorus.vocoder.quality import boundary_jumps, one_pass_config, snr_db  # noqa: E402
from tests.vocoder.models import random_s3gen, random_tokens, random_voice  # noqa: E402


def stream_vs_one_pass(s3gen, config: VocoderConfig, tokens: list[int], voice, seed: int, push: int,
                       n_steps: int | None) -> dict:
    one = VocoderStage(s3gen, one_pass_config(config))
    one.add("one", voice, seed=seed, streaming=True, n_steps=n_steps)
    one.push("one", tokens, final=True)
    [reference] = one.step()
    stage = VocoderStage(s3gen, config)
    stage.add("s", voice, seed=seed, streaming=True, n_steps=n_steps)
    pieces = []
    for i in range(0, len(tokens), push):
        stage.push("s", tokens[i:i + push], final=i + push >= len(tokens))
        while stage.has_work():
            pieces += [o.samples for o in stage.step()]
    streamed = torch.cat(pieces)
    starts = torch.tensor([p.shape[0] for p in pieces]).cumsum(0)[:-1].tolist()
    jumps = boundary_jumps(streamed, starts, reach=config.crossfade_frames * 480 + 1) \
        if streamed.shape == reference.samples.shape else None
    return {
        "pieces": len(pieces), "streamed_samples": streamed.shape[0], "one_pass_samples": reference.samples.shape[0],
        "snr_db": snr_db(reference.samples, streamed) if jumps else None,
        "boundary_jump": jumps.boundary if jumps else None, "interior_jump": jumps.interior if jumps else None,
        "jump_ratio": jumps.ratio if jumps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--fullsize", action="store_true", help="also full-size turbo and original (slow)")
    parser.add_argument("--tokens", type=int, default=150)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    base = VocoderConfig()
    configs = {
        "default": base,
        "holdback6": replace(base, holdback_tokens=6),
        "context32": replace(base, hift_context_frames=32),
        "crossfade8": replace(base, crossfade_frames=8),
        "crossfade1": replace(base, crossfade_frames=1),
        "context8_crossfade8": replace(base, hift_context_frames=8, crossfade_frames=8),
    }
    models = [("turbo", True, None), ("original", True, 2)]
    if args.fullsize:
        models += [("turbo", False, None), ("original", False, 2)]
    results = []
    for name, tiny, steps in models:
        s3gen = random_s3gen(name, tiny=tiny, seed=3)
        voice = random_voice(50, seed=4)
        tokens = random_tokens(args.tokens, seed=5)
        for label, config in configs.items() if tiny else [("default", base)]:
            started = time.perf_counter()
            row = {"variant": name, "size": "tiny" if tiny else "full", "config": label,
                   "flow_steps": steps or s3gen.variant.s3gen.flow_steps, "tokens": args.tokens,
                   **stream_vs_one_pass(s3gen, config, tokens, voice, seed=7, push=7, n_steps=steps)}
            row["seconds"] = round(time.perf_counter() - started, 2)
            print(json.dumps(row), flush=True)
            results.append(row)
    Path(args.out).write_text(json.dumps({"config": asdict(base), "results": results}, indent=2))


if __name__ == "__main__":
    main()
