#!/usr/bin/env bash
# Install Chorus into .venv (the product environment; tests use .venv-test) and start the voice
# server (http://127.0.0.1:8000 unless --host/--port or CHORUS_HOST/CHORUS_PORT say otherwise).
# Without CHORUS_CHECKPOINT it writes a random-weight Turbo checkpoint in the official layout
# first and serves that (it speaks noise; the server says so). Uploaded voices are kept in
# .chorus/voices (git-ignored) unless --voices-dir, CHORUS_VOICES_DIR or a --config file says
# where. Once the server is ready it prints the address of the playground, a page to try it in a
# browser.
#   bash scripts/serve.sh [chorus serve options]        e.g. --port 9000 --api-keys my-secret-key
#   CHORUS_CHECKPOINT=ResembleAI/chatterbox-turbo bash scripts/serve.sh     # real weights (a hub id or a directory)
#   CHORUS_SERVE_DRY_RUN=1 bash scripts/serve.sh ...    # print the URL and the command; install nothing
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}

# -- what will run, from the arguments (flags win over CHORUS_* variables, as in chorus serve) --
HOST=${CHORUS_HOST:-} PORT=${CHORUS_PORT:-} CONFIG="" VOICES_FLAG=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --host) HOST=${args[i+1]:-} ;;
    --host=*) HOST=${args[i]#--host=} ;;
    --port) PORT=${args[i+1]:-} ;;
    --port=*) PORT=${args[i]#--port=} ;;
    --config) CONFIG=${args[i+1]:-} ;;
    --config=*) CONFIG=${args[i]#--config=} ;;
    --voices-dir|--voices-dir=*) VOICES_FLAG=1 ;;
  esac
done
if [[ -z "$VOICES_FLAG" && -z "${CHORUS_VOICES_DIR:-}" && -z "$CONFIG" ]]; then
  export CHORUS_VOICES_DIR=.chorus/voices  # not the repository root ('voices', chorus serve's default)
fi
URL_HOST=""  # empty: the config file says where (it is not read here)
if [[ -n "$CONFIG" && ( -z "$HOST" || -z "$PORT" ) ]]; then
  WHERE="the host and port of $CONFIG (default http://127.0.0.1:8000)"
else
  URL_HOST=${HOST:-127.0.0.1}
  [[ "$URL_HOST" == "0.0.0.0" || "$URL_HOST" == "::" ]] && URL_HOST=127.0.0.1  # all interfaces: loopback works
  [[ "$URL_HOST" == *:* ]] && URL_HOST="[$URL_HOST]"
  WHERE="http://$URL_HOST:${PORT:-8000}"
fi

VARIANT=${CHORUS_VARIANT:-turbo}
CKPT=${CHORUS_CHECKPOINT:-}
[[ -n "$CKPT" ]] || CKPT=.ckpt/$VARIANT-random
COMMAND=("$VENV/bin/chorus" serve --variant "$VARIANT" --checkpoint "$CKPT" --log-format text "$@")
if [[ -n "${CHORUS_SERVE_DRY_RUN:-}" ]]; then
  echo "would serve on $WHERE"
  [[ -n "$URL_HOST" ]] && echo "playground: $WHERE/"
  echo "voices: ${CHORUS_VOICES_DIR:-set by the arguments or the config file}"
  echo "command: ${COMMAND[*]}"
  exit 0
fi

bash scripts/install-product-env.sh "$VENV"
if [[ -z "${CHORUS_CHECKPOINT:-}" && ! -f "$CKPT/CHORUS_RANDOM_WEIGHTS.txt" ]]; then
  echo "no checkpoint given (CHORUS_CHECKPOINT): writing a RANDOM-WEIGHT $VARIANT checkpoint to $CKPT; it speaks noise"
  "$VENV/bin/chorus" checkpoint random --variant "$VARIANT" --out "$CKPT" --seed 0
fi
echo "starting chorus serve on $WHERE (ready when /ready says so; Ctrl-C stops it)"
# once ready, the playground's address (exec keeps this shell's pid, $$, for the server)
[[ -n "$URL_HOST" ]] && PYTHON="$VENV/bin/python" bash scripts/announce-ready.sh "$WHERE" $$ &
exec "${COMMAND[@]}"
