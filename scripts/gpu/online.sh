#!/usr/bin/env bash
# The online load test on one GPU: a random-weight checkpoint, `chorus serve` in the background,
# `chorus bench online` against it, the server's log and metrics kept.
#   [SERVE_ARGS="--flag value ..."] [VOICE_CLIP=clip] bash scripts/gpu/online.sh VARIANT OUT_DIR [bench online options]
# SERVE_ARGS: more `chorus serve` options (split at spaces); VOICE_CLIP: a clip uploaded once the
# server is ready, whose voice the bench then uses (`--voice`); GRPC_PORT: the server also serves
# gRPC there, and after the HTTP bench the same bench runs over gRPC against the same server
# (into bench_online_grpc_VARIANT.json)
set -uo pipefail
variant=${1:?VARIANT}; out=${2:?OUT_DIR}; shift 2
ckpt=/tmp/chorus-online-$variant port=${CHORUS_BENCH_PORT:-8123}
[[ -f $ckpt/CHORUS_RANDOM_WEIGHTS.txt ]] || python3 -m chorus.cli checkpoint random --variant "$variant" --out "$ckpt" >/dev/null
# 210 tokens per chunk: what a trained model speaks for the bench sentence (1.6 tokens/char)
python3 -m chorus.cli serve --variant "$variant" --checkpoint "$ckpt" --port "$port" --max-new-tokens 210 \
  --max-queue 1024 --voices-dir /tmp/chorus-voices ${GRPC_PORT:+--grpc-port $GRPC_PORT} ${SERVE_ARGS:-} >"$out/serve_$variant.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "server died"; tail -30 "$out/serve_$variant.log"; exit 1; }
  sleep 0.5
done
curl -s "http://127.0.0.1:$port/ready"; echo
voice=()
if [[ -n "${VOICE_CLIP:-}" ]]; then
  id=$(curl -sf "http://127.0.0.1:$port/v1/voices" -F "file=@$VOICE_CLIP" \
       | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])') || { echo "uploading $VOICE_CLIP failed"; exit 1; }
  voice=(--voice "$id")
fi
python3 -m chorus.cli bench online --url "http://127.0.0.1:$port" --out "$out/bench_online_$variant.json" \
  "${voice[@]}" "$@" 2>&1 | tail -40
if [[ -n "${GRPC_PORT:-}" ]]; then
  python3 -m chorus.cli bench online --url "http://127.0.0.1:$port" --protocol grpc --grpc-target "127.0.0.1:$GRPC_PORT" \
    --out "$out/bench_online_grpc_$variant.json" "${voice[@]}" "$@" 2>&1 | tail -40
fi
curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics_$variant.txt"
