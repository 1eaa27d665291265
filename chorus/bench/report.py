"""How every ``chorus bench`` command hands its report over: a table for people on stderr, the
JSON on stdout, and with ``--out`` the same JSON written atomically (never half a file)."""
from __future__ import annotations

import json
import sys

from chorus.atomic import atomic_write_text


def write_report(report: dict, out: str | None, table: str | None = None) -> None:
    if table:
        print(table, file=sys.stderr)
    text = json.dumps(report, indent=2)
    if out:
        atomic_write_text(out, text + "\n")
    print(text)
