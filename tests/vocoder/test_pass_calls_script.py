"""scripts/measure_pass_calls.py runs and reports what docs/vocoder.md quotes from it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_counts_calls_per_stream_added_and_per_pass(tmp_path):
    out = tmp_path / "calls.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_pass_calls.py"), "--streams", "3", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert report["streams"] == 3
    assert report["add"]["host_calls_per_stream"] <= 12
    for name in ("first_window_pass", "second_window_pass"):
        assert report[name]["host_calls"] > 0 and report[name]["model_calls"] > 0
