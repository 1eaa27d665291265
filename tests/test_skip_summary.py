"""A test run's closing line names what was skipped and how to include it (tests/skip_summary.py),
checked on a small pytest run in a subprocess with this suite's conftest."""
from __future__ import annotations

from tests.test_run_temp_dir import run_pytest

TESTS = '''import pytest

@pytest.mark.browser
def test_browser():
    pytest.skip("no chromium")

@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2])
def test_gpu(n):
    pytest.skip("needs a CUDA device")

def test_other():
    pytest.skip("an optional package is missing")

@pytest.mark.oracle
def test_parity_of_a_variant_without_cfg():
    pytest.skip("turbo has no CFG")  # marked, but not skipped for want of the oracle

def test_fails():
    assert False
'''


def test_the_last_line_counts_the_skipped_tests_by_kind_and_says_how_to_include_them(tmp_path):
    result, _ = run_pytest(tmp_path, TESTS)
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == ("skipped: 1 browser tests (no Chromium: apt-get install chromium, or CHORUS_CHROMIUM=PATH, "
                         "includes them); 2 GPU tests (no CUDA device: scripts/gpu/README.md runs them on one); "
                         "2 others (the reasons are listed above, 'SKIPPED')"), result.stdout
    assert "1 failed" in lines[-2] and result.returncode == 1  # the exit code is still pytest's


def test_a_run_that_skipped_nothing_says_so(tmp_path):
    result, _ = run_pytest(tmp_path, "def test_ok():\n    pass\n")
    assert result.stdout.strip().splitlines()[-1] == "skipped: nothing" and result.returncode == 0
