#!/usr/bin/env bash
# Install Chorus into .venv (the product environment; tests use .venv-test) and start the voice
# server on http://127.0.0.1:8000. Without CHORUS_CHECKPOINT it writes a random-weight Turbo
# checkpoint in the official layout first and serves that (it speaks noise; the server says so).
#   bash scripts/serve.sh [chorus serve options]        e.g. --port 9000 --api-keys my-secret-key
#   CHORUS_CHECKPOINT=ResembleAI/chatterbox-turbo bash scripts/serve.sh     # real weights (a hub id or a directory)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
bash scripts/install-product-env.sh "$VENV"

VARIANT=${CHORUS_VARIANT:-turbo}
CKPT=${CHORUS_CHECKPOINT:-}
if [[ -z "$CKPT" ]]; then
  CKPT=.ckpt/$VARIANT-random
  if [[ ! -f "$CKPT/CHORUS_RANDOM_WEIGHTS.txt" ]]; then
    echo "no checkpoint given (CHORUS_CHECKPOINT): writing a RANDOM-WEIGHT $VARIANT checkpoint to $CKPT; it speaks noise"
    "$VENV/bin/chorus" checkpoint random --variant "$VARIANT" --out "$CKPT" --seed 0
  fi
fi
echo "starting chorus serve on http://127.0.0.1:${CHORUS_PORT:-8000} (ready when /ready says so; Ctrl-C stops it)"
exec "$VENV/bin/chorus" serve --variant "$VARIANT" --checkpoint "$CKPT" --log-format text "$@"
