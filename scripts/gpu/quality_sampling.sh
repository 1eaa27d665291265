#!/usr/bin/env bash
# Does DNSMOS sampling cost the GPU server throughput (docs/quality.md)? `chorus serve` (turbo,
# random weights, canaries every 3 s) with --quality-sample-rate 0 and 1.0 alternately, twice,
# each under `chorus bench online` at 32 clients for 30 s; prints each run's delivered audio
# seconds per second, DNSMOS's scored and skipped counts, and the canary mismatches under load.
#   bash scripts/gpu/quality_sampling.sh OUT_DIR       (needs chorus-tts[quality] importable)
set -uo pipefail
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TQDM_DISABLE=1
python3 -c "import chorus.server.app; from chorus.quality import dnsmos; assert dnsmos.available()" \
  || { echo "chorus or chorus-tts[quality] is not importable"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
ckpt=/tmp/ckpt-turbo
python3 -m chorus.cli checkpoint random --variant turbo --out $ckpt >/dev/null || exit 1
run() {
  local rate=$1 label=$2 start=$SECONDS
  python3 -m chorus.cli serve --variant turbo --checkpoint $ckpt --port 8123 --max-new-tokens 210 --max-queue 1024 \
    --voices-dir /tmp/v --quality-sample-rate $rate --canary-interval-s 3 --log-format text \
    >$OUT/serve_$label.log 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf http://127.0.0.1:8123/ready >/dev/null && break
    kill -0 $pid 2>/dev/null || { tail -30 $OUT/serve_$label.log; return 1; }
    sleep 0.5
  done
  echo "$label ready after $((SECONDS - start)) s"
  python3 -m chorus.cli bench online --url http://127.0.0.1:8123 --concurrency 32 --duration-s 30 --warmup 2 \
    --quiet --out $OUT/online_$label.json >/dev/null 2>$OUT/bench_$label.err
  curl -s http://127.0.0.1:8123/metrics >$OUT/metrics_$label.txt
  kill $pid; wait $pid 2>/dev/null
  echo "$label canary: unconfirmed $(grep -c 'confirming with a second canary' $OUT/serve_$label.log)" \
    "confirmed $(grep -c 'canary mismatch:' $OUT/serve_$label.log)"
  python3 - $OUT/online_$label.json $OUT/metrics_$label.txt $label <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); lvl = r["levels"][-1] if "levels" in r else r
m = open(sys.argv[2]).read().splitlines()
dn = [l for l in m if l.startswith("chorus_dnsmos_score_count") and 'score="ovrl"' in l]
sk = [l for l in m if l.startswith("chorus_dnsmos_skipped_requests_total")]
can = [l for l in m if l.startswith("chorus_canary_") and not l.startswith("chorus_canary_mismatches_created")]
sec = [l for l in m if l.startswith(("chorus_dnsmos_scoring_seconds_sum", "chorus_dnsmos_scoring_seconds_count"))]
print(sys.argv[3], "throughput_audio_s_per_s", lvl.get("throughput_audio_s_per_s"), "ok", lvl.get("ok"),
      "failed", lvl.get("failed"),
      "ttfa_p50", lvl["ttfa_s"]["p50"], dn, sk, sec, can)
PY
}
run 0 off1; run 1.0 on1; run 0 off2; run 1.0 on2
