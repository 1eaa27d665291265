"""``chorus bench``: benchmarks that print JSON reports. The stages live in three modules: the
models and kernels timed in this process (bench_models, bench_kernels), a running server under
load (bench_server), and the quality of what a server or a pipeline speaks (bench_quality)."""
from __future__ import annotations

import argparse
import sys

from chorus.cli import bench_kernels, bench_models, bench_quality, bench_server
from chorus.cli.options import add_command, add_group


def add_parser(sub) -> None:
    bench_sub = add_group(sub, "bench", help="benchmarks that print JSON", dest="bench_command", metavar="STAGE")
    bench_models.add_parsers(bench_sub)  # t3, vocoder, vc, offline, stream
    bench_server.add_parsers(bench_sub)  # online, swap
    bench_kernels.add_parsers(bench_sub)  # sampler, shared-prefix
    _add_plot_parser(bench_sub)
    bench_quality.add_parser(bench_sub)


def _add_plot_parser(bench_sub) -> None:
    p = add_command(
        bench_sub, "plot", help="figures from bench reports; ttfa: time to first audio (p50, p99) against "
                    "concurrency from `chorus bench stream` reports (needs matplotlib)")
    p.add_argument("figure", choices=("ttfa",), help="the figure to draw")
    p.add_argument("png", metavar="PNG", help="the PNG file to write")
    p.add_argument("reports", nargs="+", metavar="REPORT", help="JSON reports, one line (pair) each")
    p.set_defaults(handler=_cmd_bench_plot)


def _cmd_bench_plot(args: argparse.Namespace) -> int:
    from chorus.bench.plot import plot_ttfa
    from chorus.cli.checks import check_input_file, check_output_file

    check_output_file(args.png, "PNG")
    for path in args.reports:
        check_input_file(path, "REPORT")
    print(f"wrote {plot_ttfa(args.png, args.reports)}", file=sys.stderr)
    return 0
