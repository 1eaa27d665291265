"""``chorus bench``: benchmarks that print JSON reports. The stages live in three modules: the
models and kernels timed in this process (bench_models, bench_kernels), a running server under
load (bench_server), and the quality of what a server or a pipeline speaks (bench_quality). Here:
``plot`` (figures from reports) and ``index`` (the index of ``benchmarks/results/``)."""
from __future__ import annotations

import argparse
import sys

from chorus.cli import bench_kernels, bench_models, bench_quality, bench_server
from chorus.cli.options import CliError, add_command, add_group


def add_parser(sub) -> None:
    bench_sub = add_group(sub, "bench", help="benchmarks that print JSON", dest="bench_command", metavar="STAGE")
    bench_models.add_parsers(bench_sub)  # t3, vocoder, vc, offline, stream
    bench_server.add_parsers(bench_sub)  # online, swap
    bench_kernels.add_parsers(bench_sub)  # sampler, shared-prefix
    _add_plot_parser(bench_sub)
    _add_index_parser(bench_sub)
    bench_quality.add_parser(bench_sub)


def _add_plot_parser(bench_sub) -> None:
    plot_sub = add_group(bench_sub, "plot", help="figures (PNG) drawn from bench reports (needs matplotlib: the "
                         "[bench] extra)", dest="figure", metavar="FIGURE")
    ttfa = add_command(plot_sub, "ttfa", help="time to first audio (p50, p99) against concurrency from `chorus "
                       "bench stream` reports, one pair of lines per report")
    throughput = add_command(plot_sub, "throughput", help="delivered audio seconds per second against clients "
                             "from `chorus bench online` reports, one line per report")
    for p in (ttfa, throughput):
        p.add_argument("png", metavar="PNG", help="the PNG file to write")
        p.add_argument("reports", nargs="+", metavar="REPORT", help="JSON reports, one line (pair) each")
        p.set_defaults(handler=_cmd_bench_plot)
    roofline = add_command(plot_sub, "roofline", help="the roofline of one pass or decode step of a `chorus bench "
                           "vocoder --roofline` or `chorus bench t3 --roofline` report, as the run draws it")
    roofline.add_argument("png", metavar="PNG", help="the PNG file to write")
    roofline.add_argument("report", metavar="REPORT", help="the JSON report")
    roofline.add_argument("--pass", dest="index", type=int, default=0, metavar="INDEX",
                          help="which pass (vocoder) or decode step (t3) of the report, from 0 in the report's "
                               "order (default: 0)")
    roofline.set_defaults(handler=_cmd_bench_plot)


def _add_index_parser(bench_sub) -> None:
    from chorus.bench.results_index import DESCRIPTION, add_arguments

    p = add_command(bench_sub, "index", help="the index of benchmarks/results/ (INDEX.md) and the figures the docs "
                    "cite from it", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(handler=_cmd_bench_index)


def _cmd_bench_plot(args: argparse.Namespace) -> int:
    from chorus.bench import plot
    from chorus.cli.checks import check_input_file, check_output_file

    check_output_file(args.png, "PNG")
    for path in getattr(args, "reports", None) or [args.report]:
        check_input_file(path, "REPORT")
    try:
        plot.require_matplotlib()
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    if args.figure == "roofline":
        plot.plot_roofline(args.png, args.report, args.index)
    else:
        {"ttfa": plot.plot_ttfa, "throughput": plot.plot_throughput}[args.figure](args.png, args.reports)
    print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _cmd_bench_index(args: argparse.Namespace) -> int:
    from chorus.bench.results_index import run

    return run(args)
