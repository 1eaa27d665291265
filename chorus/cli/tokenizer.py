"""``chorus tokenize``: the T3 text input of a text, as a variant's tokenizer frames it."""
from __future__ import annotations

import argparse
import json

from chorus.cli.options import add_checkpoint, add_command, add_language_steps, add_variant, language_step_config


def add_parser(sub) -> None:
    p = add_command(sub, "tokenize", help="print the T3 text input of a text (ids, with start/stop framing)")
    add_variant(p)
    add_checkpoint(p)
    p.add_argument("--language", "-l", default=None, help="language code (multilingual variants)")
    add_language_steps(p)
    p.add_argument("text", help="the text to tokenize")
    p.set_defaults(handler=_cmd_tokenize)


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from chorus.models.loading import resolve_checkpoint_dir
    from chorus.models.variants import get_variant
    from chorus.text import load_text_encoder

    variant = get_variant(args.variant)
    encoder = load_text_encoder(variant, resolve_checkpoint_dir(variant, args.checkpoint),
                                language_steps=language_step_config(args))
    print(json.dumps(encoder.encode_framed(args.text, language=args.language)))
    return 0
