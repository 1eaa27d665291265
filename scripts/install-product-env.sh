#!/usr/bin/env bash
# Install Chorus into the product environment (default .venv; the tests use .venv-test, see
# scripts/install-test-env.sh) with the CPU build of torch unless CHORUS_TORCH_INDEX says otherwise.
#   bash scripts/install-product-env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${1:-.venv}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
# CPU wheel unless asked otherwise (PyPI's default Linux torch is the much larger CUDA build).
bash scripts/install-torch.sh "$VENV"
"$VENV/bin/python" -m pip install -q -e .
