"""The ``chorus`` command line: one module per command (group), the options they share in
:mod:`chorus.cli.options`. ``main`` is the console script's entry point."""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Callable, Sequence

from chorus import __version__
from chorus.cli import bench, checkpoint, serve, synth, tokenizer, variants, vc, voice
from chorus.cli.options import CliError
from chorus.pipeline.errors import PipelineError
from chorus.text.errors import TextError

Handler = Callable[[argparse.Namespace], int]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

COMMANDS = (variants, checkpoint, bench, serve, synth, vc, voice, tokenizer)  # in `chorus --help`'s order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chorus",
        description="Chorus: a serving engine for the Chatterbox TTS family.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"chorus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
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
