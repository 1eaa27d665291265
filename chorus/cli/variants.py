"""``chorus variants``: the supported model variants."""
from __future__ import annotations

import argparse

from chorus.cli.options import add_command


def add_parser(sub) -> None:
    p = add_command(sub, "variants", help="list the supported model variants",
                    description="List the supported model variants: description, hub repo, T3 shape "
                                "and the checkpoint files each one needs.")
    p.set_defaults(handler=_cmd_variants)


def _cmd_variants(args: argparse.Namespace) -> int:
    from chorus.models.variants import VARIANTS

    for v in VARIANTS.values():
        t3 = v.t3
        print(f"{v.name:16s} {v.description}")
        print(f"{'':16s} hub {v.hub_repo}; T3 {t3.backbone.kind} {t3.backbone.num_layers}x{t3.hidden_size}; "
              f"files: {', '.join(v.files.required)}")
    return 0
