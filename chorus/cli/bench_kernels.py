"""``chorus bench sampler|shared-prefix``: single kernels on CUDA against their PyTorch paths."""
from __future__ import annotations

import argparse

from chorus.cli.options import add_bench_out, add_command, positive_ints


def add_parsers(bench_sub) -> None:
    p = add_command(
        bench_sub, "sampler", help="the sampler's Triton kernel against the PyTorch path (CUDA): the draw alone and "
                       "the engine's whole graphed sampling step per variant and row count (docs/sampling.md)")
    p.add_argument("--variants", default="original,turbo", help="variants (comma-separated)")
    p.add_argument("--rows", default="1,64,256", help="sampled rows (comma-separated)")
    p.add_argument("--sweep", action="store_true", help="also time the kernel at other vocabulary tiles and warps")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_sampler)
    p = add_command(
        bench_sub, "shared-prefix", help="one layer's decode attention (CUDA, Turbo shapes) with and without the "
                             "shared-prefix plan at 1-256 rows and 0/34/400-token prefixes (docs/engine.md)")
    p.add_argument("--quick", action="store_true", help="fewer timed replays, no launch-knob sweep")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_shared_prefix)


def _cmd_bench_sampler(args: argparse.Namespace) -> int:
    from chorus.bench.sampler_bench import main_json
    from chorus.cli.checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    variants = tuple(v for v in args.variants.split(",") if v)
    main_json(variants, positive_ints(args.rows, "--rows"), args.sweep, args.out)
    return 0


def _cmd_bench_shared_prefix(args: argparse.Namespace) -> int:
    from chorus.bench.shared_prefix_bench import main_json
    from chorus.cli.checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    main_json(args.quick, args.out)
    return 0
