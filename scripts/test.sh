#!/usr/bin/env bash
# Install everything the tests need (into .venv-test, apart from the demo's .venv) and run the
# whole suite on the CPU. Temporary files of passed tests are removed (pyproject: tmp_path_*).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-test
bash scripts/install-test-env.sh "$VENV"
export HF_HUB_OFFLINE=1 TQDM_DISABLE=1
exec "$VENV/bin/python" -m pytest -q "$@"
