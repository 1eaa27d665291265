#!/usr/bin/env bash
# Install Chorus into .venv (the product environment; tests use .venv-test), write a random-weight Turbo checkpoint in the official layout and
# synthesise a sentence with it (the model has random weights: it speaks noise).
#   bash scripts/demo.sh ["text to speak"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
bash scripts/install-product-env.sh "$VENV"

CKPT=${CHORUS_DEMO_CHECKPOINT:-.ckpt/turbo-random}
if [[ ! -f "$CKPT/CHORUS_RANDOM_WEIGHTS.txt" ]]; then
  "$VENV/bin/chorus" checkpoint random --variant turbo --out "$CKPT" --seed 0
fi
"$VENV/bin/chorus" checkpoint check --variant turbo --checkpoint "$CKPT"
TEXT=${1:-"Hello from Chorus. This voice comes from random weights, so it speaks noise."}
# 100 speech tokens = 4 s of audio; random weights rarely stop on their own
"$VENV/bin/chorus" synth --variant turbo --checkpoint "$CKPT" --seed 0 \
  --min-new-tokens 100 --max-new-tokens 100 --out demo.wav "$TEXT"
echo "wrote demo.wav"
