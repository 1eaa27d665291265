#!/usr/bin/env bash
# Install Chorus into the product environment (default .venv; the tests use .venv-test, see
# scripts/install-test-env.sh) with the CPU build of torch unless CHORUS_TORCH_INDEX says otherwise.
# It prints each step and how long it has been running; pip's own output goes to a log file
# (VENV/install.log), whose last lines are shown if a step fails.
#   bash scripts/install-product-env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${1:-.venv}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$VENV"
LOG="$VENV/install.log"
: >"$LOG"

source scripts/step.sh

if [[ -x "$VENV/bin/python" ]]; then
  echo "[1/3] $VENV exists"
else
  step "[1/3] creating the virtual environment $VENV" "$PY" -m venv "$VENV"
fi
# CPU wheel unless asked otherwise (PyPI's default Linux torch is the much larger CUDA build).
step "[2/3] installing PyTorch, about 200 MB to download the first time" \
  bash scripts/install-torch.sh "$VENV"
step "[3/3] installing Chorus and its dependencies" "$VENV/bin/python" -m pip install -e .
echo "Chorus is installed in $VENV"
