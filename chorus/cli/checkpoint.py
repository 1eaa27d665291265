"""``chorus checkpoint random|check``: write a random-weight checkpoint, verify a checkpoint's files."""
from __future__ import annotations

import argparse

from chorus.cli.options import add_checkpoint, add_command, add_group, add_t3_weights, add_variant


def add_parser(sub) -> None:
    actions = add_group(sub, "checkpoint", help="write or check checkpoints in the official layout",
                        dest="checkpoint_command", metavar="ACTION")
    p = add_command(actions, "random",
                    help="write a random-weight checkpoint directory (for tests and benchmarks; it speaks noise)")
    add_variant(p)
    p.add_argument("--out", "-o", required=True,
                   help="directory to write (new, empty, or an earlier random checkpoint, which is replaced)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help="comma-separated subset of: t3, voice_encoder, s3gen, tokenizer, conds")
    p.set_defaults(handler=_cmd_checkpoint_random)
    p = add_command(actions, "check", help="open and verify every file of a checkpoint: tensors, keys, "
                                           "shapes, the built-in voice and the tokenizer")
    add_variant(p)
    add_checkpoint(p)
    add_t3_weights(p)
    p.set_defaults(handler=_cmd_checkpoint_check)


def _cmd_checkpoint_random(args: argparse.Namespace) -> int:
    from chorus.models.random_checkpoint import COMPONENTS, NOISE_WARNING, write_random_checkpoint
    from chorus.models.variants import get_variant

    from chorus.cli.checks import check_output_directory
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
    results = check_checkpoint(Checkpoint.open(variant, args.checkpoint, t3_weights=args.t3_weights))
    for result in results:
        print(result.render())
    return 0 if all(r.ok for r in results) else 1
