"""The ``chorus`` command line."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import MISSING as dataclasses_MISSING
from pathlib import Path
from typing import Callable, Sequence

from chorus import __version__
from chorus.engine.config import KV_CACHE_DTYPES as KV_CACHE_DTYPE_CHOICES
from chorus.text.chunking import DEFAULT_MAX_CHARS
from chorus.pipeline.errors import PipelineError
from chorus.text.errors import TextError

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """An error to show the user as one line, without a traceback."""


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _add_command(sub, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser: its help line doubles as its ``--help`` description, and options are
    never matched by prefix (``--text`` must not silently mean ``--text-file``)."""
    return sub.add_parser(name, help=help, description=description or help, allow_abbrev=False)


def _add_dtype(parser: argparse.ArgumentParser) -> None:
    from chorus.models.loading import DTYPE_CHOICES

    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="precision: auto (bf16 on CUDA, fp32 on the CPU; the default), fp32, bf16 or fp16")


def _add_variant(parser: argparse.ArgumentParser) -> None:
    from chorus.models.variants import VARIANTS

    parser.add_argument("--variant", "-V", default="original",
                        help=f"model variant: {', '.join(VARIANTS)} (default: original)")


def _add_checkpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", "-c", default=None, metavar="DIR_OR_REPO",
                        help="local directory in the official layout, or a Hugging Face hub repo id "
                             "(default: the variant's official repo)")


def _add_language_steps(parser: argparse.ArgumentParser) -> None:
    """The options of the multilingual language steps (docs/text.md)."""
    parser.add_argument("--language-steps", default=None, choices=("lenient", "strict"),
                        help="multilingual variants: lenient speaks a language whose step lacks its package or "
                             "model as the reference does (plain text, one warning); strict refuses to start "
                             "(default: lenient; env CHORUS_LANGUAGE_STEPS)")
    parser.add_argument("--dicta-model", default=None, metavar="FILE",
                        help="Hebrew: Dicta's ONNX model (dicta-1.0.onnx) for chorus-tts[he] (default: env "
                             "CHORUS_DICTA_MODEL, else the cached copy, downloaded once unless HF_HUB_OFFLINE is set)")
    parser.add_argument("--pkuseg-model", default=None, metavar="DIR",
                        help="Chinese: a spacy-pkuseg model directory for chorus-tts[zh] (default: env "
                             "CHORUS_PKUSEG_MODEL, else spacy-pkuseg's default model in PKUSEG_HOME, downloaded "
                             "once unless HF_HUB_OFFLINE is set)")


def _language_steps(args: argparse.Namespace):
    from chorus.text import LanguageStepConfig

    return LanguageStepConfig.from_options(args.language_steps, args.dicta_model, args.pkuseg_model)


def _add_reference_timing(parser: argparse.ArgumentParser) -> None:
    from chorus.bench.reference_timing import DEFAULT_REFERENCE_CHUNKS, MIN_TIMED_AUDIO_S

    parser.add_argument("--reference-chunks", type=int, default=DEFAULT_REFERENCE_CHUNKS, metavar="N",
                        help="the least workload chunks the reference is timed on, evenly spaced over the "
                             f"workload, after one untimed warm-up call (default: {DEFAULT_REFERENCE_CHUNKS}; more "
                             "are taken until --reference-min-audio-s)")
    parser.add_argument("--reference-min-audio-s", type=float, default=MIN_TIMED_AUDIO_S, metavar="SECONDS",
                        help="audio the reference's timed chunks must add up to at the fixed lengths "
                             f"(default: {MIN_TIMED_AUDIO_S:g})")


def _cmd_variants(args: argparse.Namespace) -> int:
    from chorus.models.variants import VARIANTS

    for v in VARIANTS.values():
        t3 = v.t3
        print(f"{v.name:16s} {v.description}")
        print(f"{'':16s} hub {v.hub_repo}; T3 {t3.backbone.kind} {t3.backbone.num_layers}x{t3.hidden_size}; "
              f"files: {', '.join(v.files.required)}")
    return 0


def _cmd_checkpoint_random(args: argparse.Namespace) -> int:
    from chorus.models.random_checkpoint import COMPONENTS, NOISE_WARNING, write_random_checkpoint
    from chorus.models.variants import get_variant

    from chorus.cli_checks import check_output_directory
    from chorus.models.random_checkpoint import is_random_checkpoint

    variant = get_variant(args.variant)
    components = COMPONENTS if args.only is None else tuple(c.strip() for c in args.only.split(","))
    check_output_directory(args.out, "--out", replaceable=is_random_checkpoint)
    out = write_random_checkpoint(variant, args.out, seed=args.seed, components=components)
    print(f"wrote a {variant.name} checkpoint ({', '.join(components)}) to {out}")
    print(f"WARNING: {NOISE_WARNING}")
    return 0


def _cmd_checkpoint_check(args: argparse.Namespace) -> int:
    from chorus.models.checkpoint_check import check_checkpoint
    from chorus.models.loading import Checkpoint
    from chorus.models.variants import get_variant

    variant = get_variant(args.variant)
    results = check_checkpoint(Checkpoint.open(variant, args.checkpoint))
    for result in results:
        print(result.render())
    return 0 if all(r.ok for r in results) else 1


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from chorus.models.loading import resolve_checkpoint_dir
    from chorus.models.variants import get_variant
    from chorus.text import load_text_encoder

    variant = get_variant(args.variant)
    encoder = load_text_encoder(variant, resolve_checkpoint_dir(variant, args.checkpoint),
                                language_steps=_language_steps(args))
    print(json.dumps(encoder.encode_framed(args.text, language=args.language)))
    return 0


def _cmd_bench_t3(args: argparse.Namespace) -> int:
    from chorus.bench.t3_bench import T3BenchConfig, main_json
    from chorus.cli_checks import check_input_file, check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.text_file is not None:
        check_input_file(args.text_file, "--text-file")
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
        **_roofline_options(args),
    )
    main_json(cfg, args.out)
    return 0


def _cmd_bench_vocoder(args: argparse.Namespace) -> int:
    from chorus.bench.vocoder_bench import VocoderBenchConfig, main_json
    from chorus.cli_checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.repeats < 1:
        raise CliError(f"--repeats must be at least 1, got {args.repeats}")
    if args.flow_steps is not None and args.flow_steps < 1:
        raise CliError(f"--flow-steps must be at least 1, got {args.flow_steps}")
    kernels = {name: getattr(args, name) for name in ("hift_ops", "flow_ops") if getattr(args, name) is not None}
    cfg = VocoderBenchConfig(
        variant=args.variant, checkpoint=args.checkpoint, dtype=args.dtype, device=args.device,
        batch_sizes=_positive_ints(args.batch_sizes, "--batch-sizes"),
        new_tokens=_positive_ints(args.new_tokens, "--new-tokens"), repeats=args.repeats,
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
        from chorus.bench.roofline import require_matplotlib

        try:
            require_matplotlib()
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
    return {"roofline": args.roofline, "peak_tflops": args.peak_tflops, "peak_gbps": args.peak_gbps}


def _cmd_bench_vc(args: argparse.Namespace) -> int:
    from chorus.bench.vc_bench import VCBenchConfig, main_json
    from chorus.cli_checks import check_output_file

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


def _cmd_bench_sampler(args: argparse.Namespace) -> int:
    from chorus.bench.sampler_bench import main_json
    from chorus.cli_checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    variants = tuple(v for v in args.variants.split(",") if v)
    main_json(variants, _positive_ints(args.rows, "--rows"), args.sweep, args.out)
    return 0


def _cmd_bench_shared_prefix(args: argparse.Namespace) -> int:
    from chorus.bench.shared_prefix_bench import main_json
    from chorus.cli_checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    main_json(args.quick, args.out)
    return 0


def _cmd_bench_plot(args: argparse.Namespace) -> int:
    from chorus.bench.plot import plot_ttfa
    from chorus.cli_checks import check_input_file, check_output_file

    check_output_file(args.png, "PNG")
    for path in args.reports:
        check_input_file(path, "REPORT")
    print(f"wrote {plot_ttfa(args.png, args.reports)}", file=sys.stderr)
    return 0


def _positive_ints(value: str, option: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise CliError(f"{option} must be comma-separated integers, got {value!r}") from None
    if any(n < 1 for n in numbers):
        raise CliError(f"{option} values must be at least 1, got {value!r}")
    return numbers


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


def _pipeline_bench_config(args: argparse.Namespace):
    from chorus.bench.pipeline_bench import PipelineBenchConfig

    return PipelineBenchConfig(
        variant=args.variant, checkpoint=args.checkpoint, dtype=args.dtype, device=args.device,
        text_file=getattr(args, "text_file", None), tokens_per_char=args.tokens_per_char,
        cfg_weight=args.cfg_weight, flow_steps=args.flow_steps, reference=getattr(args, "reference", False),
        **({"reference_chunks": args.reference_chunks, "reference_min_audio_s": args.reference_min_audio_s}
           if hasattr(args, "reference_chunks") else {}),
        concurrency=tuple(int(c) for c in getattr(args, "concurrency", "1").split(",")),
        cuda_graphs=not args.no_cuda_graphs, vocoder=_vocoder_config(args))


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


def _cmd_bench_online(args: argparse.Namespace) -> int:
    from chorus.bench.online_bench import DEFAULT_TEXT, OnlineBenchConfig, OnlineBenchError, OverloadConfig
    from chorus.bench.online_run import run_online
    from chorus.bench.report import write_report
    from chorus.cli_checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    try:
        concurrency = tuple(int(c) for c in args.concurrency.split(","))
    except ValueError:
        raise CliError(f"--concurrency must be comma-separated integers, got {args.concurrency!r}") from None
    if args.agent:
        return _bench_online_agent(args, concurrency)
    given = [flag for name, flag in _AGENT_OPTIONS.items() if getattr(args, name) is not None]
    if given:
        raise CliError(f"{', '.join(given)}: only with --agent")
    overload = None
    if args.arrival_rate is not None or args.overload_multiple is not None:
        try:
            overload = OverloadConfig(arrival_rate=args.arrival_rate, overload_multiple=args.overload_multiple,
                                      requests=args.overload_requests, duration_s=args.overload_duration_s,
                                      seed=args.arrival_seed)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    cfg = OnlineBenchConfig(
        url=args.url, api_key=args.api_key, model=args.model, voice=args.voice, concurrency=concurrency,
        requests_per_level=args.requests_per_level, duration_s=args.duration_s,
        text=DEFAULT_TEXT if args.text is None else args.text,
        response_format=args.response_format, max_new_tokens=args.max_new_tokens, warmup=args.warmup,
        timeout_s=args.timeout_s, honor_retry_after=args.honor_retry_after, overload=overload,
        client_processes=args.client_processes, ramp_s=0.0 if args.ramp_s is None else args.ramp_s)
    try:
        report = run_online(cfg, progress=not args.quiet)
    except OnlineBenchError as exc:
        raise CliError(str(exc)) from None
    write_report(report, args.out)
    return 0


def _chunking(value: str) -> dict:
    """``min_chars=40,max_chars=200,max_wait_ms=300`` -> ``{"min_chars": 40, ...}``."""
    out = {}
    for item in value.split(","):
        key, sep, raw = item.partition("=")
        if not sep or not raw.strip().lstrip("-").isdigit():
            raise CliError(f"--chunking takes KEY=INT pairs separated by commas, got {value!r}")
        out[key.strip()] = int(raw)
    return out


# ``chorus bench online --agent`` options -> AgentBenchConfig fields (None: not given; the config's default)
_AGENT_OPTIONS = {"turns": "--turns", "llm_tokens_per_s": "--llm-tokens-per-s", "token_spacing": "--token-spacing",
                  "cancel_fraction": "--cancel-fraction", "turn_gap_s": "--turn-gap-s",
                  "turn_gap_max_s": "--turn-gap-max-s", "listen": "--listen",
                  "agent_seed": "--agent-seed",
                  "chunking": "--chunking"}  # --ramp-s serves both modes
_HTTP_ONLY_OPTIONS = {"requests_per_level": "--requests-per-level", "duration_s": "--duration-s",
                      "arrival_rate": "--arrival-rate", "overload_multiple": "--overload-multiple"}


def _bench_online_agent(args: argparse.Namespace, concurrency: tuple[int, ...]) -> int:
    """``chorus bench online --agent``: voice agents over the WebSocket (chorus/bench/ws_bench.py)."""
    from chorus.bench.online_bench import OnlineBenchError
    from chorus.bench.report import write_report
    from chorus.bench.ws_bench import AgentBenchConfig, run_agent

    given = [flag for name, flag in _HTTP_ONLY_OPTIONS.items() if getattr(args, name) is not None]
    given += ["--honor-retry-after"] if args.honor_retry_after else []
    given += ["--client-processes"] if args.client_processes != 1 else []
    if given:
        raise CliError(f"{', '.join(given)}: not with --agent (it runs --turns turns on each connection)")
    options = {name: getattr(args, name) for name in _AGENT_OPTIONS if getattr(args, name) is not None}
    if "agent_seed" in options:
        options["seed"] = options.pop("agent_seed")
    if "chunking" in options:
        options["chunking"] = _chunking(options["chunking"])
    if args.text is not None:
        options["text"] = args.text
    if args.ramp_s is not None:
        options["ramp_s"] = args.ramp_s
    try:
        cfg = AgentBenchConfig(url=args.url, api_key=args.api_key, model=args.model, voice=args.voice,
                               concurrency=concurrency, response_format=args.response_format,
                               max_new_tokens=args.max_new_tokens, warmup=args.warmup, timeout_s=args.timeout_s,
                               **options)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        report = run_agent(cfg, progress=not args.quiet)
    except OnlineBenchError as exc:
        raise CliError(str(exc)) from None
    write_report(report, args.out)
    return 0


def _add_online_bench_parser(bench_sub) -> None:
    from chorus.bench.online_bench import DEFAULT_REQUESTS_PER_CLIENT, RESPONSE_FORMATS
    from chorus.bench.ws_bench import FORMATS as AGENT_FORMATS, SPACINGS, AgentBenchConfig as Agent

    p = _add_command(
        bench_sub, "online", help="load test of a running server (chorus serve): concurrent streaming clients per "
                       "level; time to first audio, end-to-end time, real-time factor, rejections, server metrics",
        description="Load-test a running `chorus serve` over HTTP. For each concurrency level N, N clients "
                    "send POST /v1/audio/speech back to back (one connection each) and read every response "
                    "as a stream, until the level's requests are spent or its --duration-s is up. 429, 503 "
                    "and 504 answers (admission control, memory pressure, deadlines) are counted, not "
                    "errors. Prints a JSON report (docs/benchmarks.md, \"Online load test\"); a line per level "
                    "goes to stderr. --agent drives the voice-agent WebSocket instead (\"Voice-agent latency\").")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None, help="bearer token, when the server has --api-keys (default: none)")
    p.add_argument("--model", default=None, help="model id to request (default: the first id of GET /v1/models)")
    p.add_argument("--voice", default="default", help="voice id (default: default, the model's built-in voice)")
    p.add_argument("--concurrency", default="1,16,64,256", help="concurrent clients per level (comma-separated; "
                                                                 "default 1,16,64,256)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--requests-per-level", type=int, default=None, metavar="N",
                        help=f"requests per level, shared by its clients (default: {DEFAULT_REQUESTS_PER_CLIENT} "
                             f"per client)")
    amount.add_argument("--duration-s", type=float, default=None, metavar="SECONDS",
                        help="run each level this long instead; requests in flight at the end finish and count")
    p.add_argument("--text", default=None, help="text of every request (default: a 26-word sentence, the one "
                                                 "`chorus bench stream` speaks); with --agent, every turn's reply "
                                                 f"(default: a {len(Agent.text.split())}-word reply of three "
                                                 "sentences)")
    p.add_argument("--response-format", default="pcm", metavar="FORMAT",
                   help=f"{', '.join(RESPONSE_FORMATS)}; with --agent {', '.join(AGENT_FORMATS)}. pcm (the default), "
                        "wav and with --agent the pcm_* and mulaw_8000 formats are measured in audio seconds; other "
                        "formats in bytes only (no audio seconds, real-time factor, stalls or throughput)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="speech tokens per text chunk, sent with each request (with --agent: per piece, in each "
                        "connection's config; default: the server's; useful against random-weight servers)")
    p.add_argument("--warmup", type=int, default=1, help="requests sent one at a time before the first level, "
                                                          "not counted (with --agent: turns on one connection; "
                                                          "default 1)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="seconds a request may take, from sending it to the end of its audio (with --agent: a "
                        "turn, from its first delta to its end; default 300)")
    p.add_argument("--ramp-s", type=float, default=None, metavar="SECONDS",
                   help="a level's clients send their first requests spread evenly over this long instead of all "
                        "at once (default 0: a level starts with a burst of N requests; with --agent: connection "
                        "i of N starts its first turn i/N of it later, default 0: all within one LLM token "
                        "interval)")
    p.add_argument("--honor-retry-after", action="store_true",
                   help="after a 429 or 503, a client waits the answer's Retry-After before its next request "
                        "(default: it sends the next one at once)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--arrival-rate", type=float, default=None, metavar="PER_S",
                      help="overload mode: open-loop Poisson arrivals at this many requests per second instead of "
                           "the closed-loop levels; reports goodput, rejections and their latency, deadline misses "
                           "after admission, KV blocks and memory over time")
    rate.add_argument("--overload-multiple", type=float, default=None, metavar="X",
                      help="overload mode at X times the capacity the closed-loop levels measured (completed "
                           "requests per second of the best level), run after them")
    p.add_argument("--overload-requests", type=int, default=200, metavar="N",
                   help="overload mode: requests to send at most (default 200)")
    p.add_argument("--overload-duration-s", type=float, default=60.0, metavar="SECONDS",
                   help="overload mode: stop sending after this long (default 60); requests in flight finish")
    p.add_argument("--arrival-seed", type=int, default=0, help="overload mode: seed of the arrival times")
    p.add_argument("--client-processes", "--overload-client-processes", dest="client_processes", type=int,
                   default=1, metavar="N",
                   help="send the requests from N processes (a level's clients split between them, the overload "
                        "mode's arrival i from process i mod N), so one busy client process's own lag does not add "
                        "to the latencies it measures (default 1; not with --agent). The overload report's "
                        "send_lag_s says whether the senders kept to their schedule")
    agent = p.add_argument_group(
        "voice-agent mode", "--agent: each level opens N WebSocket connections (WS /v1/audio/speech/stream), each an "
        "agent streaming --text as LLM token deltas turn after turn (docs/benchmarks.md, \"Voice-agent latency\")")
    agent.add_argument("--agent", action="store_true",
                       help="drive the voice-agent WebSocket instead of POST /v1/audio/speech; reports first text "
                            "delta -> first audio, flush -> last audio, stalls and barge-in latency per level")
    agent.add_argument("--turns", type=int, default=None, metavar="N",
                       help=f"turns per connection, one after the other (default {Agent.turns})")
    agent.add_argument("--llm-tokens-per-s", type=float, default=None, metavar="RATE",
                       help=f"the agent's LLM rate: text deltas per second (default {Agent.llm_tokens_per_s:g})")
    agent.add_argument("--token-spacing", default=None, choices=SPACINGS,
                       help=f"fixed: deltas 1/RATE apart; poisson: exponential gaps of mean 1/RATE "
                            f"(default {Agent.token_spacing})")
    agent.add_argument("--cancel-fraction", type=float, default=None, metavar="F",
                       help=f"barge in on this fraction of the turns: cancel at the turn's first audio "
                            f"(default {Agent.cancel_fraction:g})")
    agent.add_argument("--turn-gap-s", type=float, default=None, metavar="SECONDS",
                       help=f"pause between a turn's end and the next turn (default {Agent.turn_gap_s:g})")
    agent.add_argument("--turn-gap-max-s", type=float, default=None, metavar="SECONDS",
                       help="draw each pause uniformly between --turn-gap-s and this (seeded by --agent-seed), "
                            "as a user's answers differ in length, so listening agents drift out of step "
                            "(default: every pause --turn-gap-s)")
    agent.add_argument("--listen", action="store_const", const=True, default=None,
                       help="start a connection's next turn only once its last turn's audio has played at 1x "
                            "from its first frame (then --turn-gap-s), as an agent waits for its user to hear "
                            "the reply; a barged-in turn stops playing at its cancel (default: at the turn's end)")
    agent.add_argument("--agent-seed", type=int, default=None,
                       help=f"seed of the token spacing, the connections' phases and the cancelled turns "
                            f"(default {Agent.seed})")
    agent.add_argument("--chunking", default=None, metavar="min_chars=N,max_chars=N,max_wait_ms=N",
                       help="the connection's text threshold, sent in its config (default: the server's)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_online)


def _cmd_bench_swap(args: argparse.Namespace) -> int:
    from chorus.bench.online_bench import DEFAULT_TEXT, OnlineBenchError
    from chorus.bench.report import write_report
    from chorus.bench.swap_bench import SwapBenchConfig, run_swap
    from chorus.cli_checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    try:
        cfg = SwapBenchConfig(url=args.url, admin_key=args.admin_key, version=args.version,
                              checkpoint=args.checkpoint, api_key=args.api_key, model=args.model,
                              concurrency=args.concurrency, before_s=args.before_s, after_s=args.after_s,
                              text=DEFAULT_TEXT if args.text is None else args.text,
                              response_format=args.response_format, max_new_tokens=args.max_new_tokens,
                              timeout_s=args.timeout_s)
        report = run_swap(cfg)
    except (ValueError, OnlineBenchError) as exc:
        raise CliError(str(exc)) from None
    write_report(report, args.out)
    return 0


def _add_swap_bench_parser(bench_sub) -> None:
    p = _add_command(
        bench_sub, "swap", help="a hot swap under load: N streaming clients while the admin API loads a new "
                                "version of the model; failed and cut requests, time to first audio per phase",
        description="Load a running `chorus serve` (started with --admin-keys) with N clients sending POST "
                    "/v1/audio/speech back to back, swap the model to a new version through the admin API after "
                    "--before-s, keep the load for --after-s after the swap answered, and report per phase "
                    "(before, during, after the swap call) the outcomes, time to first audio and the versions "
                    "that served (docs/benchmarks.md, \"Swap under load\").")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--admin-key", required=True, help="an admin key of the server (its --admin-keys)")
    p.add_argument("--version", required=True, help="the label of the version to load")
    p.add_argument("--checkpoint", default=None, help="the new version's checkpoint (default: the model's own)")
    p.add_argument("--api-key", default=None, help="bearer token, when the server has --api-keys (default: none)")
    p.add_argument("--model", default=None, help="model id to load and request (default: the first of GET /v1/models)")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--before-s", type=float, default=20.0, help="seconds of load before the swap (default 20)")
    p.add_argument("--after-s", type=float, default=20.0, help="seconds of load after the swap answered (default 20)")
    p.add_argument("--text", default=None, help="text of every request (default: the 26-word sentence of "
                                                 "`chorus bench online`)")
    p.add_argument("--response-format", default="pcm", help="as for chorus bench online (default pcm)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="speech tokens per text chunk (default: the "
                                                                     "server's)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="seconds a request may take (default 300)")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_swap)


def _add_bench_out(p: argparse.ArgumentParser) -> None:
    """Where every benchmark writes its report, and the one exception to benchmarks/results/'s rule."""
    p.add_argument("--out", "-o", default=None, help="also write the JSON report to this file (atomically)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write --out into a benchmarks/results/ directory although the checkout has uncommitted "
                        "changes (default: refused; the report's provenance says which commit ran)")


def _cmd_bench_quality(args: argparse.Namespace) -> int:
    from chorus.bench.quality_bench import QualityBenchConfig, plot, run_pipeline, run_server
    from chorus.bench.report import write_report
    from chorus.cli_checks import check_output_file

    for name, flag in (("out", "--out"), ("plot", "--plot")):
        if getattr(args, name) is not None:
            check_output_file(getattr(args, name), flag)
    if (args.url is None) == (args.checkpoint is None):
        raise CliError("give --url (a running server) or --checkpoint (a pipeline in this process), not both")
    baselines = []
    for path in args.baseline or ():
        try:
            baselines.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise CliError(f"--baseline {path}: {exc}") from None
        if baselines[-1].get("bench") != "quality":
            raise CliError(f"--baseline {path}: not a report of chorus bench quality")
    texts = None
    if args.text_file is not None:
        try:
            texts = tuple(line.strip() for line in Path(args.text_file).read_text().splitlines() if line.strip())
        except OSError as exc:
            raise CliError(f"--text-file {args.text_file}: {exc}") from None
    try:
        cfg = QualityBenchConfig(**({"texts": texts} if texts is not None else {}), seed=args.seed,
                                 max_new_tokens=args.max_new_tokens, cfg_weight=args.cfg_weight,
                                 exaggeration=args.exaggeration, label=args.label)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.url is not None:
        report = run_server(cfg, args.url, model=args.model, api_key=args.api_key)
    else:
        from chorus.pipeline.pipeline import Pipeline

        device = args.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        with Pipeline.load(args.variant, args.checkpoint, dtype=args.dtype, device=device) as pipeline:
            report = run_pipeline(cfg, pipeline, source=args.checkpoint)
    if args.plot is not None:
        try:
            plot([*baselines, report], args.plot)
        except ValueError as exc:
            raise CliError(f"--plot: {exc}") from None
    write_report(report, args.out)
    return 0


def _add_quality_bench_parser(bench_sub) -> None:
    p = _add_command(
        bench_sub, "quality", help="a fixed text set through a server or a pipeline here: each request's audio "
                                   "checks and DNSMOS scores as JSON, and a plot beside earlier runs",
        description="Speak a fixed set of nine texts (or --text-file's lines), one request at a time with seeds "
                    "seed, seed+1, ..., through a running `chorus serve` (--url; its SSE done events carry the "
                    "checks) or a pipeline loaded here (--checkpoint), and print a JSON report: per request the "
                    "audio checks (clipped and silent share, RMS, seconds per character, token loops, flags) and "
                    "DNSMOS P.835 (with chorus-tts[quality]), and their medians. --plot draws them per text beside "
                    "the --baseline reports, e.g. two versions or bf16 against FP8 (docs/quality.md).")
    p.add_argument("--url", default=None, help="a running server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None, help="bearer token, when the server has --api-keys (default: none)")
    p.add_argument("--model", default=None, help="with --url: the model id (default: the first of GET /v1/models)")
    _add_variant(p)
    p.add_argument("--checkpoint", "-c", default=None, help="run in this process: the checkpoint directory or hub id")
    _add_dtype(p)
    p.add_argument("--device", default="auto", help="in this process: cuda, cpu or auto (default)")
    p.add_argument("--text-file", default=None, help="texts to speak, one per line (default: the fixed set)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first request, the others count up (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="speech tokens per text chunk (default: the "
                                                                     "server's or the variant's)")
    p.add_argument("--cfg-weight", type=float, default=None, help="CFG weight of every request (default: the "
                                                                   "variant's)")
    p.add_argument("--exaggeration", type=float, default=None, help="exaggeration of every request (default: the "
                                                                     "variant's)")
    p.add_argument("--label", default=None, help="this run's name in the report and the plot (default: the model)")
    p.add_argument("--baseline", action="append", default=None, metavar="REPORT",
                   help="an earlier report of this command to plot beside this run (repeatable)")
    p.add_argument("--plot", default=None, metavar="PNG", help="write the side-by-side plot here")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_quality)


def _add_bench_model(p: argparse.ArgumentParser) -> None:
    """What every model benchmark takes: the variant, its checkpoint (random weights by
    default), the precision and the device."""
    _add_variant(p)
    p.add_argument("--checkpoint", "-c", default=None,
                   help="checkpoint dir or hub id (default: random weights in a temporary directory)")
    _add_dtype(p)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")


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
    _add_bench_out(p)


def _read_text(args: argparse.Namespace) -> str:
    if (args.text is None) == (args.text_file is None):
        raise CliError("give the text to speak as an argument or with --text-file (exactly one of them)")
    if args.text_file is None:
        return args.text
    from chorus.cli_checks import check_input_file

    check_input_file(args.text_file, "--text-file")
    try:
        with open(args.text_file, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise CliError(f"--text-file {args.text_file} is not UTF-8 text ({exc.reason})") from None


def _cmd_synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    from chorus.audio.encode import format_from_path, write_audio
    from chorus.models.loading import Checkpoint
    from chorus.models.variants import get_variant
    from chorus.pipeline.planner import RequestPlanner, is_voice_file
    from chorus.pipeline.request import SpeechRequest
    from chorus.cli_checks import check_input_file, check_output_file
    from chorus.models.loading import resolve_dtype
    from chorus.models.random_checkpoint import random_weights_token_cap
    from chorus.text import load_text_encoder
    from chorus.voices import Voice, prepare_voice_audio

    # Everything that can be wrong with the inputs and outputs is checked before the models load.
    variant = get_variant(args.variant)
    fmt = format_from_path(args.out)
    check_output_file(args.out, "--out")
    text = _read_text(args)
    if args.voice is not None:
        check_input_file(args.voice, "--voice")
    dtype = resolve_dtype(args.dtype, args.device)  # warns (once) about a slow choice
    checkpoint = Checkpoint.open(variant, args.checkpoint)
    args.max_new_tokens, note = random_weights_token_cap(checkpoint.has_random_weights, args.max_new_tokens,
                                                         args.min_new_tokens)
    if note is not None:
        print(f"chorus: note: {note}", file=sys.stderr)
    request = SpeechRequest(
        text, language=args.language, exaggeration=args.exaggeration, cfg_weight=args.cfg_weight,
        temperature=args.temperature, top_p=args.top_p, min_p=args.min_p, top_k=args.top_k,
        repetition_penalty=args.repetition_penalty, seed=args.seed, max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens, flow_steps=args.flow_steps, watermark=args.watermark,
        normalize=not args.no_normalize)

    def no_voice_yet():
        raise AssertionError("validate() does not resolve voices")

    language_steps = _language_steps(args)
    RequestPlanner(variant, load_text_encoder(variant, checkpoint.directory, language_steps=language_steps),
                   builtin_voice=no_voice_yet, max_chars=args.max_chars).validate(request)
    voice = reference = None
    if args.voice is None:
        if not checkpoint.has_builtin_voice():
            raise CliError(f"the checkpoint at {checkpoint.directory} has no built-in voice; pass --voice FILE")
    elif is_voice_file(args.voice):
        voice = Voice.load(args.voice).check_variant(variant)
    else:
        reference = prepare_voice_audio(args.voice, variant)

    from chorus.pipeline.models import SpeechModels

    models = SpeechModels.load(variant, checkpoint, dtype=dtype, device=args.device,
                               voice_models=reference is not None, language_steps=language_steps)
    if reference is not None:
        voice = models.front_end.build(reference, name=Path(args.voice).stem)
    request.voice = voice
    plan = models.planner(args.max_chars).plan(request)
    show_progress = not args.quiet and sys.stderr.isatty()
    if args.exact:
        from chorus.synthesis import Synthesizer

        result = Synthesizer(models, max_chars=args.max_chars).run(plan, progress=show_progress)
    else:
        result = _run_pipeline(models, plan, args.max_chars, show_progress)
    write_audio(args.out, result.wav, result.sample_rate, fmt)
    print(f"wrote {args.out}: {result.duration:.2f} s at {result.sample_rate} Hz ({fmt}), "
          f"{len(result.chunks)} chunk(s), seed {result.seed}"
          + (f"; ignored for {variant.name}: {', '.join(result.ignored)}" if result.ignored else ""))
    return 0


def _run_pipeline(models, plan, max_chars: int, show_progress: bool):
    """Run one plan through the pipeline, with a progress bar of chunks, audio seconds and
    speed (x real time) when ``show_progress``."""
    import time

    from chorus.pipeline.pipeline import Pipeline, PipelineConfig

    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan.chunks), unit="chunk", desc="synthesizing", leave=False)
    start, audio = time.monotonic(), [0.0]

    def progress(update) -> None:
        audio[0] += update.audio_seconds
        if bar is not None:
            elapsed = max(time.monotonic() - start, 1e-9)
            bar.set_postfix_str(f"{audio[0]:.1f} s audio, {audio[0] / elapsed:.2f}x real time", refresh=False)
            bar.update(1)

    try:
        with Pipeline(models, PipelineConfig(max_chars=max_chars)) as pipe:
            return pipe.submit(plan, progress=progress).result()
    finally:
        if bar is not None:
            bar.close()


def _cmd_voice_create(args: argparse.Namespace) -> int:
    from pathlib import Path

    from chorus.models.loading import Checkpoint
    from chorus.models.variants import get_variant
    from chorus.voices.voice import VOICE_FILE_SUFFIX
    from chorus.voices import VoiceFrontEnd, prepare_voice_audio

    from chorus.cli_checks import check_input_file, check_output_file

    variant = get_variant(args.variant)
    if Path(args.out).suffix.lower() != VOICE_FILE_SUFFIX:
        raise CliError(f"--out must name a {VOICE_FILE_SUFFIX} file, got {args.out!r}")
    check_output_file(args.out, "--out")
    check_input_file(args.audio, "--audio")
    reference = prepare_voice_audio(args.audio, variant)
    front_end = VoiceFrontEnd.from_checkpoint(Checkpoint.open(variant, args.checkpoint), device=args.device)
    voice = front_end.build(reference, name=args.name or Path(args.audio).stem)
    voice.save(args.out)
    note = f" (cut to its first {reference.policy.max_seconds:g} s)" if reference.truncated else ""
    print(f"wrote voice {voice.name!r} for {variant.name} to {args.out}: reference {reference.duration:.2f} s"
          f"{note}, {voice.t3_prompt_tokens.shape[1]} T3 prompt tokens, "
          f"{voice.s3gen_prompt_tokens.shape[1]} S3Gen prompt tokens; content hash {voice.content_hash}")
    return 0


def _cmd_vc(args: argparse.Namespace) -> int:
    import os
    import re

    from chorus.audio.encode import format_from_path, write_audio
    from chorus.cli_checks import check_input_file, check_output_file
    from chorus.conversion.config import ConversionConfig
    from chorus.conversion.planner import ConversionPlanner, check_s3gen_kind
    from chorus.conversion.request import ConversionRequest
    from chorus.conversion.source import prepare_source
    from chorus.models.loading import Checkpoint, resolve_dtype
    from chorus.models.variants import get_variant
    from chorus.pipeline.planner import is_voice_file
    from chorus.voices import Voice

    # Everything that can be wrong with the inputs and outputs is checked before S3Gen loads.
    variant = get_variant(args.variant)
    fmt = format_from_path(args.out)
    check_output_file(args.out, "--out")
    check_input_file(args.source, "SOURCE")
    config = ConversionConfig(max_source_s=args.max_source_s)
    request = ConversionRequest(args.source, seed=args.seed, flow_steps=args.flow_steps, watermark=args.watermark)
    ConversionPlanner(variant, None, builtin_voice=lambda: None, config=config).validate(request)
    request.source = prepare_source(args.source, config)
    dtype = resolve_dtype(args.dtype, args.device)  # warns (once) about a slow choice
    checkpoint = Checkpoint.open(variant, args.checkpoint)
    target = args.voice
    if target == "default":
        if not checkpoint.has_builtin_voice():
            raise CliError(f"the checkpoint at {checkpoint.directory} has no built-in voice; pass --voice "
                           "with a voice file, a voice id or a reference clip")
        target = None
    elif os.path.exists(target):
        check_input_file(target, "--voice")
        if is_voice_file(target):
            target = check_s3gen_kind(Voice.load(target), variant)
        else:  # a reference clip: decoded and checked now, embedded once S3Gen is loaded
            from chorus.audio import ReferencePolicy, prepare_reference

            target = prepare_reference(target, ReferencePolicy(variant_name="voice conversion"))
    elif re.fullmatch(r"[a-z0-9_-]{1,64}", target):
        target = _stored_voice(target, args.voices_dir, variant)
    else:
        raise CliError(f"--voice {target}: no such file, and not a voice id")

    from chorus.conversion.runner import convert_on_stage
    from chorus.models.s3gen.s3gen import S3Gen
    from chorus.vocoder import VocoderStage

    s3gen = S3Gen.from_checkpoint(checkpoint, dtype=dtype, device=args.device, voice_models=True)

    def builtin():
        return Voice.from_conditionals(checkpoint.builtin_voice_state())

    request.voice = target
    plan = ConversionPlanner.for_s3gen(s3gen, builtin_voice=builtin, config=config).plan(request)
    result = convert_on_stage(VocoderStage(s3gen), plan)
    write_audio(args.out, result.wav, result.sample_rate, fmt)
    print(f"wrote {args.out}: {result.duration:.2f} s at {result.sample_rate} Hz ({fmt}), converted from "
          f"{plan.source_seconds:.2f} s of source ({len(plan.tokens)} speech tokens) to voice "
          f"{plan.target.name or args.voice!r}, seed {result.seed}")
    return 0


def _stored_voice(voice_id: str, voices_dir: str | None, variant):
    """A voice of the voice store kept in ``voices_dir`` (the directory `chorus serve` keeps
    uploaded voices in), checked for the loaded S3Gen kind."""
    import os

    from chorus.conversion.planner import check_s3gen_kind
    from chorus.voices.store import UnknownVoiceError, VoiceStore, VoiceStoreError

    directory = voices_dir or os.environ.get("CHORUS_VOICES_DIR") or "voices"
    if not os.path.isdir(directory):
        raise CliError(f"--voice {voice_id}: no such file, and no voices directory {directory} to look the id "
                       "up in (--voices-dir)")
    store = VoiceStore(directory, None, variant, builtin=None, cache_size=0)
    try:
        return check_s3gen_kind(store.get(voice_id), variant)
    except UnknownVoiceError:
        raise CliError(f"--voice {voice_id}: no such file, and no {variant.name} voice {voice_id!r} in "
                       f"{directory}") from None
    except VoiceStoreError as exc:  # e.g. a voice not built for this variant yet: no voice models here
        raise CliError(f"--voice {voice_id}: {exc}") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    from chorus.server.config import build_config, field_names, read_config_file
    from chorus.server.main import serve

    file_values = read_config_file(args.config) if args.config else None
    flags = {name: getattr(args, name) for name in field_names()}
    config = build_config(file_values, flags=flags)
    if config.checkpoint is not None and not Path(config.checkpoint).exists() and "/" not in config.checkpoint:
        raise CliError(f"--checkpoint {config.checkpoint!r} is neither a directory nor a hub id (owner/name)")
    if config.replicas != "1":
        try:
            from chorus.deploy import run_local
        except ImportError as exc:
            raise CliError(f"--replicas {config.replicas} needs Ray Serve: pip install 'chorus-tts[ray]' ({exc})")
        run_local(config)
        return 0
    serve(config)
    return 0


def _add_serve_parser(sub) -> None:
    from dataclasses import fields

    from chorus.server.config import ENV_PREFIX, FIELD_HELP, SHOWN_DEFAULTS, ServerConfig

    p = _add_command(sub, "serve", help="run the voice server (OpenAI-compatible HTTP API)",
                     description="Load a checkpoint and serve it over HTTP: POST /v1/audio/speech (OpenAI-"
                                 "compatible, streaming), /v1/voices, /v1/models, /health, /ready, /metrics. "
                                 "Every option can also come from a CHORUS_<OPTION> environment variable "
                                 "(e.g. CHORUS_MAX_QUEUE=64) or a --config file; flags win over the "
                                 "environment, which wins over the file. See docs/server.md.")
    p.add_argument("--config", default=None, metavar="FILE", help="a .toml or .json file of settings")
    defaults = ServerConfig.__dataclass_fields__
    for f in fields(ServerConfig):
        if f.name == "degradation":
            continue
        flag = "--" + f.name.replace("_", "-")
        default = defaults[f.name].default if f.default is not dataclasses_MISSING else None
        shown = SHOWN_DEFAULTS.get(f.name, "none" if default in (None, ()) else default)
        env = f"env {ENV_PREFIX}{f.name.upper()}"
        described = FIELD_HELP[f.name]
        if "(default:" in described and described.endswith(")"):  # the help says the default in words
            text = f"{described[:-1]}; {env})"
        else:
            text = f"{described} (default: {shown}; {env})"
        kind = str(f.type)
        if kind == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            p.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=text)
    p.set_defaults(handler=_cmd_serve)


def _add_synth_parser(sub) -> None:
    p = _add_command(sub, "synth", help="speak a text (or a whole book with --text-file) to an audio file",
                     description="Speak TEXT (or --text-file) with a variant's models and write "
                                 "a .wav, .flac or .mp3 file. The text is split into sentence chunks "
                                 "that are generated in parallel through the pipeline (continuous "
                                 "batching of T3, batched S3Gen); --exact runs them one at a time on the "
                                 "plain reference path instead. Unset options use the variant's defaults. "
                                 "A random-weight checkpoint caps speech tokens at 100 per chunk unless "
                                 "--max-new-tokens is given.")
    _add_variant(p)
    _add_checkpoint(p)
    p.add_argument("text", nargs="?", default=None, help="the text to speak")
    p.add_argument("--text-file", default=None, help="read the text from this UTF-8 file instead")
    p.add_argument("--out", "-o", required=True, help="output file; the format comes from .wav, .flac or .mp3")
    p.add_argument("--voice", default=None, metavar="FILE",
                   help="reference clip (any audio file) or a voice saved by `chorus voice create` "
                        "(.safetensors); default: the checkpoint's built-in voice")
    p.add_argument("--language", "-l", default=None, help="language code (required by multilingual variants)")
    _add_language_steps(p)
    p.add_argument("--exaggeration", type=float, default=None, help="emotion strength (original, multilingual)")
    p.add_argument("--cfg-weight", type=float, default=None, help="classifier-free guidance weight (0 disables)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    p.add_argument("--min-p", type=float, default=None, help="min-p threshold in [0, 1]")
    p.add_argument("--top-k", type=int, default=None, help="top-k (Turbo/Nano; 0 disables)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="repetition penalty (1 disables)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a random one, printed)")
    p.add_argument("--flow-steps", type=int, default=None, help="S3Gen solver steps (default 10; Turbo/Nano 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="speech tokens per chunk at most (25 per second)")
    p.add_argument("--min-new-tokens", type=int, default=None, help="speech tokens per chunk at least (EOS banned before)")
    p.add_argument("--watermark", choices=["perth"], default=None,
                   help="apply Resemble's Perth watermark (needs the `watermark` extra); default: none")
    _add_dtype(p)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                   help=f"longest text chunk in characters (default {DEFAULT_MAX_CHARS}); chunks end at sentences")
    p.add_argument("--no-normalize", action="store_true",
                   help="speak the text as written (no spelling-out of numbers and abbreviations)")
    p.add_argument("--exact", action="store_true",
                   help="run the plain sequential reference path (one chunk at a time) instead of the pipeline")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(handler=_cmd_synth)


def _add_vc_parser(sub) -> None:
    from chorus.conversion.config import DEFAULT_MAX_SOURCE_S

    p = _add_command(sub, "vc", help="voice conversion: say the words of a recording in another voice",
                     description="Convert SOURCE (speech in any audio file) to the voice --voice and write a .wav, "
                                 ".flac or .mp3 file, as the reference's ChatterboxVC does: the source at 16 kHz "
                                 "is turned into speech tokens by the checkpoint's S3 tokenizer, and S3Gen "
                                 "speaks them with the target's S3Gen conditioning. Only the checkpoint's S3Gen "
                                 "file (and conds.pt for the built-in voice) is read; T3 is not loaded. See "
                                 "docs/voice-conversion.md.")
    _add_variant(p)
    _add_checkpoint(p)
    p.add_argument("source", metavar="SOURCE", help="the speech to convert (an audio file)")
    p.add_argument("--voice", required=True, metavar="VOICE",
                   help="the target voice: 'default' (the checkpoint's built-in voice), a voice file saved by "
                        "`chorus voice create` (.safetensors, built for a variant with the same S3Gen: "
                        "original/multilingual or turbo/nano), a voice id of the voice store in --voices-dir, "
                        "or a reference clip (any audio file; its first 10 s are used)")
    p.add_argument("--voices-dir", default=None, metavar="DIR",
                   help="where `chorus serve` keeps uploaded voices, for --voice ID (default: env "
                        "CHORUS_VOICES_DIR, else ./voices)")
    p.add_argument("--out", "-o", required=True, help="output file; the format comes from .wav, .flac or .mp3")
    p.add_argument("--seed", type=int, default=None, help="random seed of S3Gen's noise (default: a random one, printed)")
    p.add_argument("--flow-steps", type=int, default=None, help="S3Gen solver steps (default 10; Turbo/Nano 2)")
    p.add_argument("--max-source-s", type=float, default=DEFAULT_MAX_SOURCE_S, metavar="SECONDS",
                   help=f"refuse a longer source (default: {DEFAULT_MAX_SOURCE_S:g})")
    p.add_argument("--watermark", choices=["perth"], default=None,
                   help="apply Resemble's Perth watermark (needs the `watermark` extra); default: none")
    _add_dtype(p)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    p.set_defaults(handler=_cmd_vc)


def _add_voice_parser(sub) -> None:
    voice = _add_command(sub, "voice", help="build voices from reference clips")
    voice_sub = voice.add_subparsers(dest="voice_command", metavar="ACTION")
    p = _add_command(voice_sub, "create", help="build a voice from a reference clip and save it (.safetensors)")
    _add_variant(p)
    _add_checkpoint(p)
    p.add_argument("--audio", "-a", required=True, help="reference clip (5-15 s of clean speech works best)")
    p.add_argument("--out", "-o", required=True, help="voice file to write (.safetensors)")
    p.add_argument("--name", default=None, help="voice name stored in the file (default: the clip's file name)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    p.set_defaults(handler=_cmd_voice_create)
    voice.set_defaults(handler=lambda a: (voice.print_help(), 2)[1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chorus",
        description="Chorus: a serving engine for the Chatterbox TTS family.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"chorus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _add_command(sub, "variants", help="list the supported model variants",
                     description="List the supported model variants: description, hub repo, T3 shape "
                                 "and the checkpoint files each one needs.")
    p.set_defaults(handler=_cmd_variants)

    ckpt = _add_command(sub, "checkpoint", help="write or check checkpoints in the official layout")
    ckpt_sub = ckpt.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    p = _add_command(
        ckpt_sub, "random", help="write a random-weight checkpoint directory (for tests and benchmarks; it speaks noise)")
    _add_variant(p)
    p.add_argument("--out", "-o", required=True,
                   help="directory to write (new, empty, or an earlier random checkpoint, which is replaced)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help="comma-separated subset of: t3, voice_encoder, s3gen, tokenizer, conds")
    p.set_defaults(handler=_cmd_checkpoint_random)
    p = _add_command(ckpt_sub, "check", help="open and verify every file of a checkpoint: tensors, keys, "
                                             "shapes, the built-in voice and the tokenizer")
    _add_variant(p)
    _add_checkpoint(p)
    p.set_defaults(handler=_cmd_checkpoint_check)
    ckpt.set_defaults(handler=lambda a: (ckpt.print_help(), 2)[1])

    bench = _add_command(sub, "bench", help="benchmarks that print JSON")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="STAGE")
    p = _add_command(
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
    _add_roofline(p, "one decode step per batch size (the layers' GEMMs and attention; use a large batch)")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_t3)
    p = _add_command(
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
    p.add_argument("--hift-ops", choices=("auto", "triton", "torch"), default=None,
                   help="kernels of HiFT's Snake activations (VocoderConfig.hift_ops): auto (default) fuses each "
                        "into one Triton kernel on CUDA, torch runs the plain tensor ops")
    p.add_argument("--flow-ops", choices=("auto", "triton", "torch"), default=None,
                   help="kernels of the flow estimator's norms (VocoderConfig.flow_ops): auto (default) fuses each "
                        "causal block's LayerNorm + Mish + mask and each transformer block's residual add + "
                        "LayerNorm into one Triton kernel on CUDA, torch runs the plain tensor ops")
    p.add_argument("--no-yardstick", action="store_true",
                   help="skip the yardstick (the pass's modules in plain PyTorch as one CUDA graph; reported as "
                        "yardstick_seconds and yardstick_fraction)")
    _add_roofline(p, "each pass's modules (HiFT, flow encoder, estimator)")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_vocoder)
    p = _add_command(
        bench_sub, "vc", help="voice conversion, one at a time as `chorus vc` runs it: a source clip of --source-s "
                    "seconds to the built-in voice, timed as tokenizing and the S3Gen pass (docs/voice-conversion.md)")
    _add_bench_model(p)
    p.add_argument("--source-s", type=float, default=10.0, help="the source clip's length in seconds (0.1-60)")
    p.add_argument("--repeats", type=int, default=10, help="timed conversions (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed conversions first")
    p.add_argument("--flow-steps", type=int, default=None, help="flow solver steps (default: the variant's)")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_vc)
    p = _add_command(
        bench_sub, "offline", help="the whole path (T3 + S3Gen) on the benchmark text, all chunks at once; optionally "
                        "the reference generate(), warm, on evenly spaced chunks for the ratio (fixed output lengths)")
    _add_pipeline_bench_options(p)
    p.add_argument("--text-file", default=None, help="workload text (default: the shipped benchmark text)")
    p.add_argument("--reference", action="store_true",
                   help="also time the reference chatterbox-tts generate() (needs chatterbox-tts installed)")
    _add_reference_timing(p)
    p.set_defaults(handler=_cmd_bench_offline)
    p = _add_command(
        bench_sub, "stream", help="streaming: time to first audio, gaps between audio pieces and real-time factor per "
                       "stream at several concurrency levels")
    _add_pipeline_bench_options(p)
    p.add_argument("--concurrency", default="1,16,64,256", help="concurrent streams per level (comma-separated)")
    p.set_defaults(handler=_cmd_bench_stream)
    _add_online_bench_parser(bench_sub)
    _add_swap_bench_parser(bench_sub)
    p = _add_command(
        bench_sub, "sampler", help="the sampler's Triton kernel against the PyTorch path (CUDA): the draw alone and "
                       "the engine's whole graphed sampling step per variant and row count (docs/sampling.md)")
    p.add_argument("--variants", default="original,turbo", help="variants (comma-separated)")
    p.add_argument("--rows", default="1,64,256", help="sampled rows (comma-separated)")
    p.add_argument("--sweep", action="store_true", help="also time the kernel at other vocabulary tiles and warps")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_sampler)
    p = _add_command(
        bench_sub, "shared-prefix", help="one layer's decode attention (CUDA, Turbo shapes) with and without the "
                             "shared-prefix plan at 1-256 rows and 0/34/400-token prefixes (docs/engine.md)")
    p.add_argument("--quick", action="store_true", help="fewer timed replays, no launch-knob sweep")
    _add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_shared_prefix)
    p = _add_command(
        bench_sub, "plot", help="figures from bench reports; ttfa: time to first audio (p50, p99) against "
                    "concurrency from `chorus bench stream` reports (needs matplotlib)")
    p.add_argument("figure", choices=("ttfa",), help="the figure to draw")
    p.add_argument("png", metavar="PNG", help="the PNG file to write")
    p.add_argument("reports", nargs="+", metavar="REPORT", help="JSON reports, one line (pair) each")
    p.set_defaults(handler=_cmd_bench_plot)
    _add_quality_bench_parser(bench_sub)
    bench.set_defaults(handler=lambda a: (bench.print_help(), 2)[1])

    _add_serve_parser(sub)
    _add_synth_parser(sub)
    _add_vc_parser(sub)
    _add_voice_parser(sub)

    p = _add_command(sub, "tokenize", help="print the T3 text input of a text (ids, with start/stop framing)")
    _add_variant(p)
    _add_checkpoint(p)
    p.add_argument("--language", "-l", default=None, help="language code (multilingual variants)")
    _add_language_steps(p)
    p.add_argument("text", help="the text to tokenize")
    p.set_defaults(handler=_cmd_tokenize)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        if args.command == "bench":
            from chorus.bench.report import check_results_tree, set_cli_argv

            set_cli_argv(sys.argv[1:] if argv is None else argv)  # for the report's provenance
            if getattr(args, "out", None):  # `chorus bench` alone has none
                check_results_tree(args.out, allow_dirty=args.allow_dirty)  # before the run, not after it
        with warnings.catch_warnings():
            _quiet_third_party_warnings()
            return handler(args)
    except KeyboardInterrupt:
        print("chorus: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (CliError, TextError, ValueError, OSError, ImportError) as exc:
        print(f"chorus: error: {exc}", file=sys.stderr)
        return 2
    except PipelineError as exc:  # a model step failed after the inputs were accepted
        print(f"chorus: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.command == "bench":
            from chorus.bench.report import set_cli_argv

            set_cli_argv(None)


def _quiet_third_party_warnings() -> None:
    """Python warnings from other packages (pkg_resources deprecation, torch notices) are not
    for our users; ``python -W`` or ``PYTHONWARNINGS`` still turn them on."""
    if not sys.warnoptions:
        warnings.simplefilter("ignore")
        warnings.filterwarnings("default", module=r"chorus(\.|$)")


if __name__ == "__main__":
    sys.exit(main())
