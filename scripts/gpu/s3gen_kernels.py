"""Where S3Gen's device time goes, per kernel, and what fusing would buy; writes JSON to --out.

    python scripts/gpu/s3gen_kernels.py --out results/s3gen_kernels.json
    python scripts/gpu/s3gen_kernels.py --out /tmp/smoke.json --device cpu --tiny   # smoke test
    python scripts/gpu/s3gen_kernels.py --flow-only --new-tokens 23 --out flow.json  # a first window

Full-size S3Gen with random weights (the work does not depend on the weights), bf16 on CUDA,
one batch of B items of N new tokens on a P-token voice prompt (default turbo, 32 x 250 on 250:
the offline workload's large passes). Reported:

- ``whole``: ``S3Gen.tokens_to_wav`` timed (median of --repeats, synchronised), and the
  profiler's CUDA time per kernel class (convolution, GEMM, attention, elementwise, FFT, other)
  with the top kernels;
- ``hift``: HiFT's ``decode`` alone on that pass's mel shape (B x 2N frames), eager, with
  cuDNN's autotuner, and under ``torch.compile`` (default mode; its compile time too), each with
  the audio's SNR against eager, and the eager kernel classes;
- ``flow``: the flow's ``generate_mel`` (conformer encoder, projection, the solver's steps with
  the variant's CFG) on that pass's shape (B items of P + N tokens), eager and compiled, with the
  mel's SNR against eager and the kernel classes of each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chorus.vocoder.quality import snr_db  # noqa: E402
from tests.vocoder.models import random_s3gen, random_tokens, random_voice  # noqa: E402

CLASSES = (  # first match wins; lower-case substrings of kernel names
    ("convolution", ("conv", "implicit_gemm", "cudnn", "wgrad", "dgrad", "fprop", "xmma_fprop")),
    ("attention", ("flash", "fmha", "attention", "efficient_attention")),
    ("gemm", ("gemm", "cutlass", "nvjet", "matmul", "sm90_xmma")),
    ("fft", ("fft", "radix")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "triton", "copy", "cat",
                     "index", "where", "pow", "sin", "fill")),
)


def classify(name: str) -> str:
    lowered = name.lower()
    for label, keys in CLASSES:
        if any(k in lowered for k in keys):
            return label
    return "other"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def kernel_profile(fn, device: torch.device, top: int = 12) -> dict:
    """One call under the profiler: device time per kernel class (ms) and the top kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        sync(device)
    classes: dict[str, float] = {}
    kernels: list[tuple[str, float, int]] = []
    events = prof.key_averages()
    typed = any(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
    for event in events:
        if device.type == "cuda":
            # kernels only: an operator's self device time is its kernels' counted again
            if (event.device_type != torch.autograd.DeviceType.CUDA) if typed else event.key.startswith("aten::"):
                continue
            device_us = getattr(event, "self_device_time_total", 0.0)
        else:
            device_us = event.self_cpu_time_total if not event.key.startswith("aten::") else 0.0
        if device_us <= 0:
            continue
        kernels.append((event.key, device_us / 1e3, event.count))
        label = classify(event.key)
        classes[label] = classes.get(label, 0.0) + device_us / 1e3
    kernels.sort(key=lambda k: -k[1])
    return {"classes_ms": {k: round(v, 3) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
            "total_ms": round(sum(classes.values()), 3),
            "top": [{"kernel": name[:120], "ms": round(ms, 3), "calls": calls} for name, ms, calls in kernels[:top]]}


def flow_figures(s3gen, args, device: torch.device, dtype: torch.dtype) -> dict:
    """``generate_mel`` over B items of prompt + new tokens, eager and compiled (see the module doc)."""
    flow = s3gen.flow
    settings = s3gen.variant.s3gen
    ratio, width = flow.config.token_mel_ratio, args.prompt_tokens + args.new_tokens
    g = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, 6561, (args.batch, width), generator=g, device=device)
    lengths = torch.full((args.batch,), width, dtype=torch.long, device=device)
    cond = torch.zeros(args.batch, 80, ratio * width, device=device, dtype=dtype)
    cond[:, :, :ratio * args.prompt_tokens] = torch.randn(args.batch, 80, ratio * args.prompt_tokens, generator=g,
                                                         device=device).to(dtype) - 5.0
    noise = torch.randn(args.batch, 80, ratio * width, generator=g, device=device).to(dtype)
    speaker = torch.randn(args.batch, 80, generator=g, device=device).to(dtype)
    n_steps = flow.config.default_steps
    cfg_rate = settings.cfg_rate
    guidance = None if flow.config.meanflow or not cfg_rate else (1.0 + cfg_rate, cfg_rate)
    out: dict = {"tokens": width, "n_steps": n_steps, "guided": guidance is not None}

    def call(fn):
        def run():
            with torch.inference_mode():
                return fn(tokens, lengths, cond, noise, speaker, n_steps, guidance)
        return run

    eager = call(flow.generate_mel)
    timed(eager, device, 2)
    seconds, reference = timed(eager, device, args.repeats)
    out["eager"] = {"ms": round(seconds * 1e3, 3), "profile": kernel_profile(eager, device)}
    print("flow eager", out["eager"]["ms"], out["eager"]["profile"]["classes_ms"], flush=True)
    if not args.no_compile:
        try:
            compiled = call(torch.compile(flow.generate_mel, dynamic=False))
            started = time.perf_counter()
            compiled()
            sync(device)
            compile_s = time.perf_counter() - started
            timed(compiled, device, 2)
            seconds, mel = timed(compiled, device, args.repeats)
            out["compiled"] = {"ms": round(seconds * 1e3, 3), "compile_s": round(compile_s, 1),
                               "snr_db": round(snr_db(reference.float(), mel.float()), 2),
                               "profile": kernel_profile(compiled, device)}
        except Exception as error:  # a measurement script: record why and go on
            out["compiled"] = {"error": f"{type(error).__name__}: {error}"[:2000]}
        print("flow compiled", {k: v for k, v in out["compiled"].items() if k != "profile"}, flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", default="turbo")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=250)
    parser.add_argument("--prompt-tokens", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models (a smoke test)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--flow-only", action="store_true", help="measure the flow alone (no whole call, no HiFT)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s3gen = random_s3gen(args.variant, tiny=args.tiny, dtype=dtype, device=str(device))
    voice = random_voice(args.prompt_tokens, seed=1)
    tokens = [random_tokens(args.new_tokens, seed=i) for i in range(args.batch)]
    report: dict = {"variant": args.variant, "batch": args.batch, "new_tokens": args.new_tokens,
                    "prompt_tokens": args.prompt_tokens, "dtype": str(dtype).removeprefix("torch."),
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__}

    if args.flow_only:
        report["flow"] = flow_figures(s3gen, args, device, dtype)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        return 0

    def whole():
        return s3gen.tokens_to_wav(tokens, voice, seeds=list(range(args.batch)))

    timed(whole, device, 2)  # warm-up
    seconds, audio = timed(whole, device, args.repeats)
    report["whole"] = {"seconds": round(seconds, 4),
                       "audio_seconds": round(sum(a.numel() for a in audio) / 24000, 2),
                       "profile": kernel_profile(whole, device)}
    print("whole", report["whole"]["seconds"], report["whole"]["profile"]["classes_ms"], flush=True)

    hift = s3gen.mel2wav
    frames = 2 * args.new_tokens
    g = torch.Generator(device=device).manual_seed(0)
    mel = (torch.randn(args.batch, 80, frames, generator=g, device=device) - 5.0).to(dtype)
    source = 0.1 * torch.randn(args.batch, frames * hift.config.samples_per_frame, generator=g, device=device)
    counts = torch.full((args.batch,), frames, device=device, dtype=torch.long)

    def decode():
        with torch.inference_mode():
            return hift.decode(mel, source, counts)

    results = {}
    timed(decode, device, 2)
    seconds, reference = timed(decode, device, args.repeats)
    results["eager"] = {"ms": round(seconds * 1e3, 3), "profile": kernel_profile(decode, device)}
    print("hift eager", results["eager"]["ms"], results["eager"]["profile"]["classes_ms"], flush=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        timed(decode, device, 3)
        seconds, out = timed(decode, device, args.repeats)
        results["cudnn_benchmark"] = {"ms": round(seconds * 1e3, 3), "snr_db": round(snr_db(reference, out), 2)}
        torch.backends.cudnn.benchmark = False
        print("hift cudnn.benchmark", results["cudnn_benchmark"], flush=True)
    if not args.no_compile:
        try:
            compiled = torch.compile(hift.decode, dynamic=False)
            started = time.perf_counter()
            with torch.inference_mode():
                compiled(mel, source, counts)
            sync(device)
            compile_s = time.perf_counter() - started

            def decode_compiled():
                with torch.inference_mode():
                    return compiled(mel, source, counts)

            timed(decode_compiled, device, 2)
            seconds, out = timed(decode_compiled, device, args.repeats)
            results["compiled"] = {"ms": round(seconds * 1e3, 3), "compile_s": round(compile_s, 1),
                                   "snr_db": round(snr_db(reference, out), 2),
                                   "profile": kernel_profile(decode_compiled, device)}
        except Exception as error:  # a measurement script: record why and go on
            results["compiled"] = {"error": f"{type(error).__name__}: {error}"[:2000]}
        print("hift compiled", {k: v for k, v in results["compiled"].items() if k != "profile"}, flush=True)
    report["hift"] = {"frames": frames, **results}
    report["flow"] = flow_figures(s3gen, args, device, dtype)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
