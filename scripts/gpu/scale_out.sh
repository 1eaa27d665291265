#!/usr/bin/env bash
# Scale-out on one machine: the same online load against one and against two engine replicas on
# Ray Serve (chorus.deploy.run_local, what `chorus serve --replicas N` runs), one GPU each.
#   bash scripts/gpu/scale_out.sh VARIANT OUT_DIR
# Env: SCALE_LEVELS_1 / SCALE_LEVELS_2 (concurrency levels per replica count), SCALE_SECONDS.
set -uo pipefail
variant=${1:?VARIANT}; out=${2:?OUT_DIR}
ckpt=/tmp/chorus-online-$variant port=${CHORUS_BENCH_PORT:-8124}
levels_1=${SCALE_LEVELS_1:-64,128,256} levels_2=${SCALE_LEVELS_2:-128,256,512} seconds=${SCALE_SECONDS:-20}
[[ -f $ckpt/CHORUS_RANDOM_WEIGHTS.txt ]] || python3 -m chorus.cli checkpoint random --variant "$variant" --out "$ckpt" >/dev/null
for replicas in 1 2; do
  levels=levels_$replicas
  # 210 tokens per chunk: what a trained model speaks for the bench sentence (1.6 tokens/char)
  python3 - "$variant" "$ckpt" "$port" "$replicas" >"$out/serve_${variant}_x$replicas.log" 2>&1 <<'PY' &
import sys
from chorus.deploy import run_local
from chorus.server.config import build_config
variant, ckpt, port, replicas = sys.argv[1:]
run_local(build_config(flags=dict(variant=variant, checkpoint=ckpt, port=int(port), max_new_tokens=210,
                                  max_queue=1024, voices_dir="/tmp/chorus-voices", replicas=replicas)))
PY
  server=$!
  ready=0
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$port/metrics" 2>/dev/null | grep -q "^chorus_front_replicas{ready=\"true\"} $replicas.0" && { ready=1; break; }
    kill -0 $server 2>/dev/null || break
    sleep 0.5
  done
  if [[ $ready != 1 ]]; then echo "$replicas replica(s) did not become ready"; tail -40 "$out/serve_${variant}_x$replicas.log"; kill $server; wait $server; exit 1; fi
  echo "== $replicas replica(s) ready"
  python3 -m chorus.cli bench online --url "http://127.0.0.1:$port" --concurrency "${!levels}" --duration-s "$seconds" \
    --quiet --out "$out/bench_scale_${variant}_x$replicas.json" 2>&1 | tail -8
  curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics_${variant}_x$replicas.txt"
  kill -INT $server; wait $server
  pkill -9 -f 'raylet|gcs_server|ray::' 2>/dev/null; sleep 2  # anything the shutdown left behind
done
python3 - "$out" "$variant" <<'PY'
import json, sys
out, variant = sys.argv[1:]
runs = {n: json.load(open(f"{out}/bench_scale_{variant}_x{n}.json")) for n in (1, 2)}
summary = {"variant": variant, "runs": runs}
json.dump(summary, open(f"{out}/scale_out_{variant}.json", "w"), indent=1)
def s(value):
    return "-" if value is None else f"{value:.3f} s"
for n, run in runs.items():
    for level in run.get("levels", []):
        print(f"{n} replica(s), {level['concurrency']} clients: {level['ok']}/{level['requests']} ok, time to first "
              f"audio p50 {s(level['ttfa_s']['p50'])} p99 {s(level['ttfa_s']['p99'])}, "
              f"{level['throughput_audio_s_per_s']:.1f} audio s/s")
PY
