"""``chorus bench quality``: a fixed text set spoken through a server or a pipeline, with each
request's audio checks and DNSMOS scores."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from chorus.cli.options import CliError, add_bench_out, add_command, add_dtype, add_variant


def add_parser(bench_sub) -> None:
    p = add_command(
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
    add_variant(p)
    p.add_argument("--checkpoint", "-c", default=None, help="run in this process: the checkpoint directory or hub id")
    add_dtype(p)
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
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_quality)


def _cmd_bench_quality(args: argparse.Namespace) -> int:
    from chorus.bench.quality_bench import QualityBenchConfig, plot, run_pipeline, run_server
    from chorus.bench.report import write_report
    from chorus.cli.checks import check_output_file

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
