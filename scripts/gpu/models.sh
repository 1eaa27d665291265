#!/usr/bin/env bash
# Several models in one server on one GPU (docs/models.md, "Measured on one H200", and docs/benchmarks.md, "Swap
# under load"): random-weight checkpoints, `chorus serve --models ...` in the background, the
# benches against it, the server's log kept.
#   bash scripts/gpu/models.sh two-models OUT_DIR   # turbo, original, each alone, then both in one server
#   bash scripts/gpu/models.sh swap OUT_DIR         # turbo swapped to a second checkpoint under 64 clients
set -uo pipefail
mode=${1:?MODE: two-models or swap}; out=${2:?OUT_DIR}
port=${CHORUS_BENCH_PORT:-8124} admin=bench-admin-key-0123456789 seconds=${ONLINE_SECONDS:-20}
checkpoint() {  # variant seed -> a random checkpoint's directory
  local dir=/tmp/chorus-models-$1-$2
  [[ -f $dir/CHORUS_RANDOM_WEIGHTS.txt ]] || python3 -m chorus.cli checkpoint random --variant "$1" --seed "$2" \
    --out "$dir" >/dev/null
  echo "$dir"
}
serve() {  # models log-name -> a server in the background, ready
  python3 -m chorus.cli serve --models "$1" --port "$port" --max-new-tokens 210 --max-queue 1024 \
    --admin-keys "$admin" --voices-dir /tmp/chorus-voices >"$out/serve_$2.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$port/ready" >/dev/null && return 0
    kill -0 $server 2>/dev/null || { echo "server died"; tail -30 "$out/serve_$2.log"; exit 1; }
    sleep 0.5
  done
  echo "server not ready"; exit 1
}
stop() {  # the running server, its metrics kept
  curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics_$1.txt"
  kill $server 2>/dev/null; wait $server 2>/dev/null; trap - EXIT
}
bench() {  # model file-name -> chorus bench online at 64 clients
  python3 -m chorus.cli bench online --url "http://127.0.0.1:$port" --model "$1" --concurrency 64 \
    --duration-s "$seconds" --quiet --out "$out/$2.json" 2>&1 | tail -5
}
turbo=$(checkpoint turbo 0)
case $mode in
  two-models)
    original=$(checkpoint original 0)
    turbo_entry="id=chatterbox-turbo,variant=turbo,checkpoint=$turbo"
    original_entry="id=chatterbox,variant=original,checkpoint=$original"
    # each model alone first (the whole GPU: the one-model figures of the ratio), in the same run
    serve "$turbo_entry" one-turbo; bench chatterbox-turbo bench_one_model_chatterbox-turbo; stop one-turbo
    serve "$original_entry" one-original; bench chatterbox bench_one_model_chatterbox; stop one-original
    serve "$turbo_entry,memory_share=0.45;$original_entry,memory_share=0.45" two-models
    for model in chatterbox-turbo chatterbox; do  # each while the other is idle
      bench "$model" "bench_two_models_$model"
    done
    stop two-models ;;
  swap)
    serve "id=chatterbox-turbo,variant=turbo,checkpoint=$turbo,memory_share=0.45" swap
    python3 -m chorus.cli bench swap --url "http://127.0.0.1:$port" --admin-key "$admin" --version 2 \
      --checkpoint "$(checkpoint turbo 1)" --concurrency 64 --before-s "$seconds" --after-s "$seconds" \
      --out "$out/bench_swap_turbo.json" 2>&1 | tail -5
    stop swap ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
