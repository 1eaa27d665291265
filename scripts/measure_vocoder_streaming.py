"""Streamed vs one-pass audio of the vocoder stage on random-weight S3Gen models.

For each variant and stage configuration, one job's tokens are pushed in pieces of odd sizes
(the stream) and, to a second stage, all at once (one pass, same seed and noise); prints and
writes JSON with the SNR of the stream against the one pass, the largest sample step near piece
boundaries against the largest elsewhere, and the length check.

    python scripts/measure_vocoder_streaming.py --out vocoder_streaming.json [--fullsize]

``--context`` measures the left-context cap (``stream_context_tokens`` L) and the prompt cap
(``prompt_tokens`` K) instead: per setting, the SNR of the stream against the one-pass audio of
the whole stream (for K: against the full-prompt one pass), the same for the mel HiFT vocoded
(each frame as the pass that settled it saw it; signal: the reference's variation around its
per-bin mean), the flow's work (flow tokens, prompt included, per audio token) and the CPU wall
time of the flow and of the passes per audio second:

    python scripts/measure_vocoder_streaming.py --context --out vocoder_context.json [--parts grid,long,full]

``--parts first`` measures the first-window prompt cap (``first_window_prompt_tokens`` K1) at the
stage's defaults; every row also gives the mel SNR of the first window's frames alone.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.vocoder import VocoderConfig, VocoderStage, VocoderStats  # noqa: E402
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


def run_stream(s3gen, config: VocoderConfig, tokens: list[int], voice, seed: int, push: int,
               n_steps: int | None) -> tuple[torch.Tensor, torch.Tensor, int, VocoderStats]:
    """(audio, mel, pieces, stats) of one job streamed ``push`` tokens at a time; ``mel`` [80, T]
    holds each frame as HiFT first vocoded it (the flow's output for the pass that settled it)."""
    stage = VocoderStage(s3gen, config)
    stage.add("s", voice, seed=seed, streaming=True, n_steps=n_steps)
    hift, spans, mels = s3gen.mel2wav, [], []
    hift_span, predict_f0 = stage._hift_span, hift.predict_f0

    def record_span(*args):
        spans.append(hift_span(*args))
        return spans[-1]

    def record_mel(mel, *args):
        start, end = spans[-1]
        mels.append((start, end, mel[0, :, :end - start].float().cpu()))
        return predict_f0(mel, *args)

    stage._hift_span, hift.predict_f0 = record_span, record_mel
    pieces = []
    try:
        for i in range(0, len(tokens), push):
            stage.push("s", tokens[i:i + push], final=i + push >= len(tokens))
            while stage.has_work():
                pieces += [o.samples for o in stage.step()]
    finally:
        del hift.predict_f0
    settled = torch.zeros(80, max(end for _, end, _ in mels))
    covered = 0
    for start, end, mel in mels:
        if end > covered:
            settled[:, covered:end] = mel[:, covered - start:]
            covered = end
    return torch.cat(pieces), settled, len(pieces), stage.stats


def mel_snr_db(reference: torch.Tensor, test: torch.Tensor) -> float:
    """SNR of a log-mel against a reference, the signal being the reference's variation around
    its per-bin mean (a log-mel's offset would otherwise dominate)."""
    signal = (reference - reference.mean(dim=1, keepdim=True)).double().pow(2).sum().item()
    noise = (test - reference).double().pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def context_rows(s3gen, *, tiny: bool, tokens: list[int], voice, steps: int | None,
                 contexts: list, first_windows: list[int], prompts: list,
                 first_window_prompts: tuple = (None,)) -> list[dict]:
    """One row per (L, first window, K, K1): the stream against the full-prompt one-pass audio."""
    base = VocoderConfig()
    reference, reference_mel, _, _ = run_stream(s3gen, one_pass_config(base), tokens, voice, 7, len(tokens), steps)
    rows = []
    for prompt in prompts:
        one_pass_k, one_pass_k_mel = (reference, reference_mel) if prompt is None else run_stream(
            s3gen, one_pass_config(replace(base, prompt_tokens=prompt)), tokens, voice, 7, len(tokens), steps)[:2]
        for first, context, first_prompt in itertools.product(first_windows, contexts, first_window_prompts):
            config = replace(base, first_window_tokens=first, stream_context_tokens=context, prompt_tokens=prompt,
                             first_window_prompt_tokens=first_prompt)
            started = time.perf_counter()
            audio, mel, pieces, stats = run_stream(s3gen, config, tokens, voice, 7, 7, steps)
            wall = time.perf_counter() - started
            seconds = audio.shape[0] / 24000
            flow = stats.flow_seconds
            row = {
                "variant": s3gen.variant.name, "size": "tiny" if tiny else "full",
                "flow_steps": steps or s3gen.variant.s3gen.flow_steps, "tokens": len(tokens),
                "voice_prompt_tokens": int(voice.s3gen_prompt_tokens.shape[1]),
                "stream_context_tokens": context, "first_window_tokens": first, "prompt_tokens": prompt,
                "first_window_prompt_tokens": first_prompt,
                "pieces": pieces, "passes": stats.passes, "length_ok": audio.shape == reference.shape,
                "snr_db": round(snr_db(reference, audio), 2),
                "snr_vs_same_prompt_one_pass_db": round(snr_db(one_pass_k, audio), 2),
                "one_pass_snr_db": None if prompt is None else round(snr_db(reference, one_pass_k), 2),
                "mel_snr_db": round(mel_snr_db(reference_mel, mel), 2),
                # the frames of the first window alone (two mel frames per token)
                "first_window_mel_snr_db":
                    round(mel_snr_db(reference_mel[:, :2 * first], mel[:, :2 * first]), 2),
                "mel_snr_vs_same_prompt_one_pass_db": round(mel_snr_db(one_pass_k_mel, mel), 2),
                "one_pass_mel_snr_db":
                    None if prompt is None else round(mel_snr_db(reference_mel, one_pass_k_mel), 2),
                "flow_tokens": stats.real_tokens,
                "flow_tokens_per_audio_token": round(stats.real_tokens / len(tokens), 2),
                "flow_s_per_audio_s": round(flow / seconds, 3),
                "pass_s_per_audio_s": round(stats.total_seconds / seconds, 3),
                "seconds": round(wall, 2),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main_context(args) -> None:
    rows = []
    parts = set(args.parts.split(","))
    models = [("turbo", True, None), ("original", True, 2)] if "grid" in parts else []
    for name, tiny, steps in models:
        s3gen = random_s3gen(name, tiny=tiny, seed=3)
        voice, tokens = random_voice(args.prompt, seed=4), random_tokens(args.tokens, seed=5)
        rows += context_rows(s3gen, tiny=tiny, tokens=tokens, voice=voice, steps=steps,
                             contexts=[None, 25, 50, 100, 150], first_windows=[10, 15, 20],
                             prompts=[None, 150, 100, 50])
    if "long" in parts:  # a long stream: how the work grows with the stream's length
        s3gen = random_s3gen("turbo", seed=3)
        voice, tokens = random_voice(args.prompt, seed=4), random_tokens(args.long_tokens, seed=5)
        rows += context_rows(s3gen, tiny=True, tokens=tokens, voice=voice, steps=None,
                             contexts=[None, 50, 100, 150], first_windows=[20], prompts=[None])
    if "first" in parts:  # the first-window prompt cap K1 at the defaults (L = 100, first window 20)
        for name, tiny, steps in (("turbo", True, None), ("original", True, 2), ("turbo", False, None)):
            s3gen = random_s3gen(name, tiny=tiny, seed=3)
            voice, tokens = random_voice(args.prompt, seed=4), random_tokens(args.tokens, seed=5)
            rows += context_rows(s3gen, tiny=tiny, tokens=tokens, voice=voice, steps=steps, contexts=[100],
                                 first_windows=[20], prompts=[None], first_window_prompts=(None, 150, 100, 50))
    if args.fullsize or "full" in parts:  # brief: the CPU cost of full size allows a few settings only
        s3gen = random_s3gen("turbo", tiny=False, seed=3)
        voice, tokens = random_voice(args.full_prompt, seed=4), random_tokens(args.full_tokens, seed=5)
        rows += context_rows(s3gen, tiny=False, tokens=tokens, voice=voice, steps=None,
                             contexts=[None, 50, 100], first_windows=[20], prompts=[None, args.full_prompt // 2])
    Path(args.out).write_text(json.dumps({"config": asdict(VocoderConfig()), "results": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--fullsize", action="store_true", help="also full-size turbo and original (slow)")
    parser.add_argument("--tokens", type=int, default=None, help="stream length (150; --context: 400)")
    parser.add_argument("--context", action="store_true",
                        help="measure stream_context_tokens and prompt_tokens (see the module docstring)")
    parser.add_argument("--prompt", type=int, default=250, help="--context: voice prompt tokens (tiny)")
    parser.add_argument("--parts", default="grid,long",
                        help="--context: comma-separated grid (tiny turbo and original, every setting), "
                             "long (tiny turbo, a --long-tokens stream), full (full-size turbo, as --fullsize), "
                             "first (the first-window prompt cap: tiny turbo and original, full-size turbo)")
    parser.add_argument("--long-tokens", type=int, default=1500, help="--context: the long stream's tokens")
    parser.add_argument("--full-tokens", type=int, default=300, help="--context --fullsize: stream length")
    parser.add_argument("--full-prompt", type=int, default=100, help="--context --fullsize: voice prompt tokens")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.context:
        args.tokens = args.tokens or 400
        main_context(args)
        return
    args.tokens = args.tokens or 150
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
