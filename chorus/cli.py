"""The ``chorus`` command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from chorus import __version__
from chorus.text.errors import TextError

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """An error to show the user as one line, without a traceback."""


def _add_variant(parser: argparse.ArgumentParser) -> None:
    from chorus.models.variants import VARIANTS

    parser.add_argument("--variant", "-V", default="original",
                        help=f"model variant: {', '.join(VARIANTS)} (default: original)")


def _add_checkpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", "-c", default=None, metavar="DIR_OR_REPO",
                        help="local directory in the official layout, or a Hugging Face hub repo id "
                             "(default: the variant's official repo)")


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

    variant = get_variant(args.variant)
    components = COMPONENTS if args.only is None else tuple(c.strip() for c in args.only.split(","))
    out = write_random_checkpoint(variant, args.out, seed=args.seed, components=components)
    print(f"wrote a {variant.name} checkpoint ({', '.join(components)}) to {out}")
    print(f"WARNING: {NOISE_WARNING}")
    return 0


def _cmd_checkpoint_check(args: argparse.Namespace) -> int:
    from chorus.models.checkpoint import compare_state_dict
    from chorus.models.loading import Checkpoint
    from chorus.models.random_checkpoint import reference_key_specs, t3_key_specs
    from chorus.models.variants import get_variant

    variant = get_variant(args.variant)
    ckpt = Checkpoint.open(variant, args.checkpoint)
    checks = [
        (variant.files.t3, ckpt.t3_state, t3_key_specs(variant), frozenset()),
        (variant.files.voice_encoder, ckpt.voice_encoder_state, reference_key_specs("ve"), frozenset()),
        (variant.files.s3gen, ckpt.s3gen_state,
         reference_key_specs("s3genmf" if variant.s3gen.meanflow else "s3gen"),
         frozenset({"tokenizer._mel_filters", "tokenizer.window"})),
    ]
    failed = False
    for name, read, specs, optional in checks:
        report = compare_state_dict(read(), {s.name: s.shape for s in specs}, str(ckpt.path(name)), optional)
        print(f"{name}: {'ok' if report.ok else 'MISMATCH'}")
        if not report.ok:
            print(report.render())
            failed = True
    print(f"{variant.files.conds}: {'present' if ckpt.has_builtin_voice() else 'absent (no built-in voice)'}")
    return 1 if failed else 0


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from chorus.models.loading import resolve_checkpoint_dir
    from chorus.models.variants import get_variant
    from chorus.text import load_text_encoder

    variant = get_variant(args.variant)
    encoder = load_text_encoder(variant, resolve_checkpoint_dir(variant, args.checkpoint))
    print(json.dumps(encoder.encode(args.text, language=args.language)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chorus",
        description="Chorus: a serving engine for the Chatterbox TTS family.",
    )
    parser.add_argument("--version", action="version", version=f"chorus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("variants", help="list the supported model variants")
    p.set_defaults(handler=_cmd_variants)

    ckpt = sub.add_parser("checkpoint", help="write or check checkpoints in the official layout")
    ckpt_sub = ckpt.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    p = ckpt_sub.add_parser(
        "random", help="write a random-weight checkpoint directory (for tests and benchmarks; it speaks noise)")
    _add_variant(p)
    p.add_argument("--out", "-o", required=True, help="directory to write")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help="comma-separated subset of: t3, voice_encoder, s3gen, tokenizer, conds")
    p.set_defaults(handler=_cmd_checkpoint_random)
    p = ckpt_sub.add_parser("check", help="verify a checkpoint's files, keys and shapes")
    _add_variant(p)
    _add_checkpoint(p)
    p.set_defaults(handler=_cmd_checkpoint_check)
    ckpt.set_defaults(handler=lambda a: (ckpt.print_help(), 2)[1])

    p = sub.add_parser("tokenize", help="print the T3 text token ids of a text")
    _add_variant(p)
    _add_checkpoint(p)
    p.add_argument("--language", "-l", default=None, help="language code (multilingual variants)")
    p.add_argument("text")
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
        return handler(args)
    except (CliError, TextError, ValueError, OSError, ImportError) as exc:
        print(f"chorus: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
