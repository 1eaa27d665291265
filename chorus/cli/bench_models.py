"""``chorus bench t3|vocoder|vc|offline|stream``: the models timed in this process, on random
weights unless --checkpoint names real ones."""
from __future__ import annotations

import argparse
from typing import Sequence

from chorus.cli.options import (
    CliError, add_bench_out, add_command, add_device, add_dtype, add_fp8, add_variant, fp8_stages, positive_ints,
)
from chorus.engine.config import KV_CACHE_DTYPES as KV_CACHE_DTYPE_CHOICES
from chorus.triton_backend import BACKENDS


def add_parsers(bench_sub) -> None:
    _add_t3_parser(bench_sub)
    _add_vocoder_parser(bench_sub)
    _add_vc_parser(bench_sub)
    _add_pipeline_parsers(bench_sub)


def _add_bench_model(p: argparse.ArgumentParser) -> None:
    """What every model benchmark takes: the variant, its checkpoint (random weights by
    default), the precision and the device."""
    add_variant(p)
    p.add_argument("--checkpoint", "-c", default=None,
                   help="checkpoint dir or hub id (default: random weights in a temporary directory)")
    add_dtype(p)
    add_device(p)


def _add_reference_timing(parser: argparse.ArgumentParser) -> None:
    from chorus.bench.reference_timing import DEFAULT_REFERENCE_CHUNKS, MIN_TIMED_AUDIO_S

    parser.add_argument("--reference-chunks", type=int, default=DEFAULT_REFERENCE_CHUNKS, metavar="N",
                        help="the least workload chunks the reference is timed on, evenly spaced over the "
                             f"workload, after one untimed warm-up call (default: {DEFAULT_REFERENCE_CHUNKS}; more "
                             "are taken until --reference-min-audio-s)")
    parser.add_argument("--reference-min-audio-s", type=float, default=MIN_TIMED_AUDIO_S, metavar="SECONDS",
                        help="audio the reference's timed chunks must add up to at the fixed lengths "
                             f"(default: {MIN_TIMED_AUDIO_S:g})")


def _add_t3_parser(bench_sub) -> None:
    p = add_command(
        bench_sub, "t3", help="T3 engine: decode step latency and tokens/s per batch size, the benchmark-text "
                   "workload, optionally the reference T3 loop for the ratio (fixed output lengths)")
    _add_bench_model(p)
    p.add_argument("--batch-sizes", default="1,8,64,256", help="concurrent requests for the decode test")
    p.add_argument("--decode-steps", type=int, default=50, help="timed decode steps per batch size")
    p.add_argument("--no-workload", action="store_true", help="skip the whole-text workload")
    p.add_argument("--text-file", default=None, help="workload text (default: the shipped benchmark text)")
    p.add_argument("--tokens-per-char", type=float, default=1.6, help="fixed output length per input character")
    p.add_argument("--cfg-weight", type=float, default=0.5, help="CFG weight for variants with CFG")
    p.add_argument("--reference", action="store_true",
                   help="also time the reference chatterbox-tts T3 loop (needs chatterbox-tts installed)")
    _add_reference_timing(p)
    p.add_argument("--no-cuda-graphs", action="store_true", help="run decode steps eagerly")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="read each step's tokens before scheduling the next (default: the next steady "
                        "decode step is queued first, overlapping host work with the forward)")
    p.add_argument("--no-shared-prefix", action="store_true",
                   help="decode rows read their whole context alone (default: rows sharing a long "
                        "voice prompt read it once per group and step where that pays)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="build engines without compiling the eager steps' Triton kernel variants first "
                        "(default: compiled at construction, reported as engine_warmup_seconds)")
    p.add_argument("--no-yardstick", "--no-speed-of-light", dest="no_yardstick", action="store_true",
                   help="skip the yardstick (the same model shape stepped in plain PyTorch, one CUDA graph per "
                        "batch size; reported as yardstick_step_ms and yardstick_ratio; the engine can beat it; "
                        "--no-speed-of-light is its former name)")
    p.add_argument("--chunk-chars", default=None, metavar="N,N,...",
                   help="also run the workload once per chunk length bound, e.g. 150,200,300,400, reporting "
                        "the chunk count, the longest chunk (characters and steps) and T3 seconds per bound "
                        "(default: no sweep)")
    p.add_argument("--max-num-seqs", type=int, default=512,
                   help="rows per engine step in the workload runs (a CFG request takes two; default 512); "
                        "a sweep bound whose chunks need more rows runs in several waves")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPE_CHOICES,
                   help="KV cache storage: auto (the model's dtype, default) or fp8_e4m3; with fp8 the report's "
                        "kv_cache section adds the logits cosine against the model-dtype cache")
    add_fp8(p)
    p.add_argument("--fp8-error-steps", type=int, default=64, metavar="N",
                   help="with --fp8 t3: teacher-forced decode steps of the report's fp8_error section (the logits "
                        "of fp32, bf16 and bf16 with FP8 linears on the bench's request; default 64)")
    p.add_argument("--timestamps", action="store_true",
                   help="also measure what word timestamps cost (Llama variants): per batch size, the decode test on "
                        "an engine keeping alignment rows (serve --timestamp-alignment), with no row and with every "
                        "row asking, against the plain decode (report's timestamps_cost)")
    _add_roofline(p, "one decode step per batch size (the layers' GEMMs and attention; use a large batch)")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_t3)


def _cmd_bench_t3(args: argparse.Namespace) -> int:
    from chorus.bench.t3_bench import T3BenchConfig, main_json
    from chorus.cli.checks import check_input_file, check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.text_file is not None:
        check_input_file(args.text_file, "--text-file")
    if args.fp8_error_steps < 1:
        raise CliError(f"--fp8-error-steps must be at least 1, got {args.fp8_error_steps}")
    cfg = T3BenchConfig(
        variant=args.variant, checkpoint=args.checkpoint, dtype=args.dtype, device=args.device,
        batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")), decode_steps=args.decode_steps,
        workload=not args.no_workload, text_file=args.text_file, tokens_per_char=args.tokens_per_char,
        cfg_weight=args.cfg_weight, reference=args.reference, reference_chunks=args.reference_chunks,
        reference_min_audio_s=args.reference_min_audio_s,
        cuda_graphs=not args.no_cuda_graphs, yardstick=not args.no_yardstick,
        async_scheduling=not args.no_async_scheduling, chunk_chars=_chunk_bounds(args.chunk_chars),
        max_num_seqs=args.max_num_seqs, kv_cache_dtype=args.kv_cache_dtype,
        shared_prefix_attention=not args.no_shared_prefix, warm_up_kernels=not args.no_warm_up,
        timestamps=args.timestamps, fp8_linears="t3" in fp8_stages(args), fp8_error_steps=args.fp8_error_steps,
        **_roofline_options(args),
    )
    main_json(cfg, args.out)
    return 0


def _chunk_bounds(value: str | None) -> tuple[int, ...]:
    from chorus.text.chunking import MIN_MAX_CHARS

    if value is None:
        return ()
    try:
        bounds = tuple(int(b) for b in value.split(","))
    except ValueError:
        raise CliError(f"--chunk-chars must be comma-separated integers, got {value!r}") from None
    if any(b < MIN_MAX_CHARS for b in bounds):
        raise CliError(f"--chunk-chars bounds must be at least {MIN_MAX_CHARS}, got {value!r}")
    return bounds


def _add_vocoder_parser(bench_sub) -> None:
    p = add_command(
        bench_sub, "vocoder", help="the vocoder stage: one batched pass per shape (jobs x new tokens), split into "
                    "flow encoder / solver / HiFT, FLOPs and TFLOP/s, against a one-CUDA-graph yardstick of the "
                    "same modules")
    _add_bench_model(p)
    p.add_argument("--batch-sizes", default="1,8,32", help="non-streaming jobs per pass (comma-separated)")
    p.add_argument("--new-tokens", default="20,100,250",
                   help="new speech tokens per job (comma-separated; on top of the built-in voice's prompt)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed passes per shape (median), also the split's repeats and the yardstick's replays")
    p.add_argument("--flow-steps", type=int, default=None, help="flow solver steps (default: the variant's)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="run the stage's solver eagerly (VocoderConfig.cuda_graphs off)")
    p.add_argument("--compile-hift", action="store_true",
                   help="run HiFT's decoder through torch.compile (VocoderConfig.compile_hift; default: eager)")
    p.add_argument("--hift-ops", choices=BACKENDS, default=None,
                   help="kernels of HiFT's Snake activations (VocoderConfig.hift_ops): auto (default) fuses each "
                        "into one Triton kernel on CUDA, torch runs the plain tensor ops")
    p.add_argument("--flow-ops", choices=BACKENDS, default=None,
                   help="kernels of the flow estimator's norms (VocoderConfig.flow_ops): auto (default) fuses each "
                        "causal block's LayerNorm + Mish + mask and each transformer block's residual add + "
                        "LayerNorm into one Triton kernel on CUDA, torch runs the plain tensor ops")
    p.add_argument("--encoder-attention-ops", choices=BACKENDS, default=None,
                   help="kernel of the flow encoder's relative-position attention "
                        "(VocoderConfig.encoder_attention_ops): torch (default) runs the plain tensor ops and SDPA, "
                        "auto one fused Triton kernel on CUDA (not measured on a GPU yet)")
    p.add_argument("--no-yardstick", action="store_true",
                   help="skip the yardstick (the pass's modules in plain PyTorch as one CUDA graph; reported as "
                        "yardstick_seconds and yardstick_fraction)")
    _add_roofline(p, "each pass's modules (HiFT, flow encoder, estimator)")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_vocoder)


def _cmd_bench_vocoder(args: argparse.Namespace) -> int:
    from chorus.bench.vocoder_bench import VocoderBenchConfig, main_json
    from chorus.cli.checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.repeats < 1:
        raise CliError(f"--repeats must be at least 1, got {args.repeats}")
    if args.flow_steps is not None and args.flow_steps < 1:
        raise CliError(f"--flow-steps must be at least 1, got {args.flow_steps}")
    kernels = {name: getattr(args, name) for name in ("hift_ops", "flow_ops", "encoder_attention_ops")
               if getattr(args, name) is not None}
    cfg = VocoderBenchConfig(
        variant=args.variant, checkpoint=args.checkpoint, dtype=args.dtype, device=args.device,
        batch_sizes=positive_ints(args.batch_sizes, "--batch-sizes"),
        new_tokens=positive_ints(args.new_tokens, "--new-tokens"), repeats=args.repeats,
        flow_steps=args.flow_steps, yardstick=not args.no_yardstick, cuda_graphs=not args.no_cuda_graphs,
        compile_hift=args.compile_hift, **kernels,  # unset: VocoderConfig's defaults
        **_roofline_options(args),
    )
    main_json(cfg, args.out)
    return 0


def _add_roofline(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--roofline", action="store_true",
                        help=f"also profile {what} per kernel class against the card's peak FLOP/s and HBM "
                             "bandwidth (docs/benchmarks.md, \"Roofline\"); with --out, a PNG plot per shape is "
                             "written next to the JSON (needs matplotlib: the [bench] extra)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="with --roofline: the card's peak TFLOP/s (default: the card table's, by precision)")
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="with --roofline: the card's memory bandwidth in GB/s (default: the card table's)")


def _roofline_options(args: argparse.Namespace) -> dict:
    """The bench config's roofline fields, checked (a plot that cannot be drawn fails before the run)."""
    for option, value in (("--peak-tflops", args.peak_tflops), ("--peak-gbps", args.peak_gbps)):
        if value is not None and not value > 0:
            raise CliError(f"{option} must be positive, got {value}")
        if value is not None and not args.roofline:
            raise CliError(f"{option} needs --roofline")
    if args.roofline and args.out is not None:
        from chorus.bench.figures import require_matplotlib

        try:
            require_matplotlib()
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
    return {"roofline": args.roofline, "peak_tflops": args.peak_tflops, "peak_gbps": args.peak_gbps}


def _add_vc_parser(bench_sub) -> None:
    p = add_command(
        bench_sub, "vc", help="voice conversion, one at a time as `chorus vc` runs it: a source clip of --source-s "
                    "seconds to the built-in voice, timed as tokenizing and the S3Gen pass (docs/voice-conversion.md)")
    _add_bench_model(p)
    p.add_argument("--source-s", type=float, default=10.0, help="the source clip's length in seconds (0.1-60)")
    p.add_argument("--repeats", type=int, default=10, help="timed conversions (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed conversions first")
    p.add_argument("--flow-steps", type=int, default=None, help="flow solver steps (default: the variant's)")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_vc)


def _cmd_bench_vc(args: argparse.Namespace) -> int:
    from chorus.bench.vc_bench import VCBenchConfig, main_json
    from chorus.cli.checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    try:
        cfg = VCBenchConfig(variant=args.variant, checkpoint=args.checkpoint, dtype=args.dtype, device=args.device,
                            source_s=args.source_s, repeats=args.repeats, warmup=args.warmup,
                            flow_steps=args.flow_steps)
    except ValueError as exc:
        raise CliError(str(exc).replace("source_s", "--source-s").replace("flow_steps", "--flow-steps")) from None
    main_json(cfg, args.out)
    return 0


def _add_pipeline_parsers(bench_sub) -> None:
    p = add_command(
        bench_sub, "offline", help="the whole path (T3 + S3Gen) on the benchmark text, all chunks at once; optionally "
                        "the reference generate(), warm, on evenly spaced chunks for the ratio (fixed output lengths)")
    _add_pipeline_bench_options(p)
    p.add_argument("--text-file", default=None, help="workload text (default: the shipped benchmark text)")
    p.add_argument("--reference", action="store_true",
                   help="also time the reference chatterbox-tts generate() (needs chatterbox-tts installed)")
    _add_reference_timing(p)
    p.set_defaults(handler=_cmd_bench_offline)
    p = add_command(
        bench_sub, "stream", help="streaming: time to first audio, gaps between audio pieces and real-time factor per "
                       "stream at several concurrency levels")
    _add_pipeline_bench_options(p)
    p.add_argument("--concurrency", default="1,16,64,256", help="concurrent streams per level (comma-separated)")
    p.set_defaults(handler=_cmd_bench_stream)


def _add_pipeline_bench_options(p: argparse.ArgumentParser) -> None:
    _add_bench_model(p)
    p.add_argument("--tokens-per-char", type=float, default=1.6, help="fixed output length per input character")
    p.add_argument("--cfg-weight", type=float, default=0.5, help="T3 CFG weight for variants with CFG")
    p.add_argument("--flow-steps", type=int, default=None, help="S3Gen solver steps (default: the variant's)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run T3 decode steps eagerly")
    p.add_argument("--first-window", type=int, default=None, help="speech tokens in a stream's first vocoder window")
    p.add_argument("--max-window", type=int, default=None, help="speech tokens in later vocoder windows at most")
    p.add_argument("--vocoder-batch", type=int, default=None, help="vocoder items per batched pass at most")
    p.add_argument("--vocoder-option", action="append", default=None, metavar="KEY=VALUE",
                   help="any VocoderConfig field (docs/vocoder.md), e.g. max_graph_rows=8; repeatable")
    add_fp8(p)
    add_bench_out(p)


def _cmd_bench_offline(args: argparse.Namespace) -> int:
    from chorus.bench.pipeline_bench import run_offline
    from chorus.bench.report import write_report

    write_report(run_offline(_pipeline_bench_config(args)), args.out)
    return 0


def _cmd_bench_stream(args: argparse.Namespace) -> int:
    from chorus.bench.pipeline_bench import run_stream
    from chorus.bench.report import write_report

    write_report(run_stream(_pipeline_bench_config(args)), args.out)
    return 0


def _pipeline_bench_config(args: argparse.Namespace):
    from chorus.bench.pipeline_bench import PipelineBenchConfig

    return PipelineBenchConfig(
        variant=args.variant, checkpoint=args.checkpoint, dtype=args.dtype, device=args.device,
        text_file=getattr(args, "text_file", None), tokens_per_char=args.tokens_per_char,
        cfg_weight=args.cfg_weight, flow_steps=args.flow_steps, reference=getattr(args, "reference", False),
        **({"reference_chunks": args.reference_chunks, "reference_min_audio_s": args.reference_min_audio_s}
           if hasattr(args, "reference_chunks") else {}),
        concurrency=tuple(int(c) for c in getattr(args, "concurrency", "1").split(",")),
        cuda_graphs=not args.no_cuda_graphs, vocoder=_vocoder_config(args), fp8_linears="t3" in fp8_stages(args))


def _vocoder_config(args: argparse.Namespace):
    from dataclasses import replace

    from chorus.vocoder import VocoderConfig

    changes = {name: value for name, value in (
        ("first_window_tokens", args.first_window), ("max_window_tokens", args.max_window),
        ("max_batch_items", args.vocoder_batch)) if value is not None}
    changes.update(parse_config_options(VocoderConfig, args.vocoder_option, "--vocoder-option"))
    try:
        return replace(VocoderConfig(), **changes)
    except ValueError as exc:
        raise CliError(f"vocoder settings: {exc}") from None


def parse_config_options(config_class, items: Sequence[str] | None, flag: str) -> dict:
    """``KEY=VALUE`` strings -> fields of a config dataclass, each value parsed as its field's
    type (bool: true/false, int, float, str; ``none`` for an optional field, whose value is read
    as the type beside None)."""
    import typing
    from dataclasses import fields

    hints = typing.get_type_hints(config_class)
    known = {}
    for f in fields(config_class):
        kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        known[f.name] = kinds[0] if kinds[0] in (bool, int, float) else str
    out = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise CliError(f"{flag} takes KEY=VALUE with KEY one of: {', '.join(sorted(known))}; got {item!r}")
        kind, raw = known[key], raw.strip()
        try:
            if raw.lower() == "none":
                value = None
            elif kind is bool:
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                value = raw.lower() in ("true", "1")
            else:
                value = kind(raw)
        except ValueError:
            raise CliError(f"{flag} {key}: cannot read {raw!r} as {kind.__name__}") from None
        out[key] = value
    return out
