#!/usr/bin/env bash
# Install PyTorch into a virtual environment: the CPU build from PyTorch's CPU index by default
# (PyPI's default Linux wheel is the much larger CUDA build), or the build of the index named by
# CHORUS_TORCH_INDEX (e.g. a CUDA index). Where that index cannot be reached (a machine that sees
# only a package mirror), it falls back to the default index at once instead of retrying.
# With --wheel-dir it downloads the same wheels (torch and its dependencies, for the Python that
# PYTHON names, default python3) into a directory instead: the container's wheelhouse.
#   bash scripts/install-torch.sh VENV_DIR
#   bash scripts/install-torch.sh --wheel-dir DIR
set -euo pipefail
USAGE="usage: install-torch.sh VENV_DIR | --wheel-dir DIR"
VERSION=${CHORUS_TORCH_VERSION:-2.13.0}
INDEX=${CHORUS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if [[ "${1:-}" == "--wheel-dir" ]]; then
  DIR=${2:?$USAGE}
  PIP=("${PYTHON:-python3}" -m pip download -q --disable-pip-version-check -d "$DIR")
else
  VENV=${1:?$USAGE}
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  if "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$VERSION')" 2>/dev/null; then
    exit 0  # already there
  fi
fi
if ! "${PIP[@]}" --retries 0 --timeout 15 "torch==$VERSION" --index-url "$INDEX" \
     --extra-index-url https://pypi.org/simple 2>/dev/null; then
  echo "note: $INDEX is not reachable; installing torch $VERSION from the default package index" >&2
  "${PIP[@]}" "torch==$VERSION"
fi
