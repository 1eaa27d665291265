#!/usr/bin/env bash
# Install everything the tests need (into .venv) and run the whole suite on the CPU.
#   bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-test-env.sh .venv
export HF_HUB_OFFLINE=1 TQDM_DISABLE=1
exec .venv/bin/python -m pytest -q "$@"
