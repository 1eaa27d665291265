#!/usr/bin/env bash
# Wait until the voice server at URL answers /ready, then say where to try it: the playground
# page (GET /, unless the server runs with --no-playground) and the speech API. Gives up quietly
# when process PID (the server) ends first. scripts/serve.sh runs it beside the server.
#   bash scripts/announce-ready.sh URL PID
set -uo pipefail
URL=${1:?usage: announce-ready.sh URL PID} PID=${2:?usage: announce-ready.sh URL PID}
PY=${PYTHON:-python3}
answers() {  # answers PATH: GET URL/PATH gives a 2xx
  "$PY" - "$URL/$1" <<'PYTHON' >/dev/null 2>&1
import sys
import urllib.request

urllib.request.urlopen(sys.argv[1], timeout=5)  # raises unless 2xx
PYTHON
}
until answers ready; do
  kill -0 "$PID" 2>/dev/null || exit 0
  sleep 1
done
if answers ""; then
  echo "ready: open $URL/ in a browser to try it (the playground), or send requests to $URL/v1/audio/speech"
else
  echo "ready: send requests to $URL/v1/audio/speech"
fi
