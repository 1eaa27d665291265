#!/usr/bin/env bash
# Install everything the tests need (into .venv-test, apart from the demo's .venv) and run the
# whole suite on the CPU. Temporary files of passed tests are removed (pyproject: tmp_path_*).
# It says what it is doing step by step; pytest's last line says which tests were skipped and how
# to include them (tests/skip_summary.py). The exit code is pytest's.
#   bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-test
echo "installing the test environment into $VENV (a few minutes the first time)"
bash scripts/install-test-env.sh "$VENV"
export HF_HUB_OFFLINE=1 TQDM_DISABLE=1
echo "running the test suite on the CPU (tens of minutes on a few cores; a dot per passed test)"
exec "$VENV/bin/python" -m pytest -q "$@"
