#!/usr/bin/env bash
# GPU checks and benchmarks, run from the repository root on a CUDA machine.
#   bash scripts/gpu/device_checks.sh CHECK OUT_DIR
# CHECK: tests | bench-original | bench-turbo | offline-original | offline-turbo |
#        stream-original | stream-turbo | stream-turbo-prompt-cap | attention | vocoder-graphs | stage-contention | online-original | online-turbo |
#        agent-original | agent-turbo | agent-turbo-listen | agent-turbo-conversation | agent-turbo-prompt-cap | agent-turbo-headroom |
#        agent-turbo-first-window | agent-turbo-admit-ahead | agent-turbo-mixed-graphs | agent-turbo-admit-within-graphs | agent-turbo-ramp | agent-turbo-profile | agent-turbo-switch | agent-turbo-queue-probe | online-turbo-short-voice | overload-turbo | two-models | swap-turbo |
#        scale-out-turbo | scale-out-original | profile-original | profile-turbo | rope-kv |
#        vocoder-turbo | vocoder-original | vc-turbo | vc-original | online-turbo-grpc | timestamps-cost |
#        encoder-attention | fp8-t3-turbo | fp8-t3-original
# The reference chatterbox-tts (for the benchmark ratio) must be importable; WHEELS=DIR installs
# it offline from wheels first (see scripts/gpu/README.md); a DIR/*.tar.xz is a pre-unpacked
# site-packages bundle (Ray without its Java and ML-library parts), unpacked beside the wheels.
set -uo pipefail
what=${1:?usage: device_checks.sh CHECK OUT_DIR (see the header)}
out=${2:?OUT_DIR}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1
if [[ -n "${WHEELS:-}" ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/chorus-site "$WHEELS"/*.whl || exit 1
  for bundle in "$WHEELS"/*.tar.xz; do [[ -f $bundle ]] && { tar -xJf "$bundle" -C /tmp/chorus-site || exit 1; }; done
  export PYTHONPATH=/tmp/chorus-site:$PWD
else
  export PYTHONPATH=$PWD
fi
# agent_bench DIR LEVELS [bench options...]: one turbo server (`chorus serve $SERVE_ARGS`) driven by voice agents at
# LEVELS connections, into DIR/agent.json (with the server's log)
agent_bench() {
  local dir=$1 levels=$2
  shift 2
  mkdir -p "$dir"
  bash scripts/gpu/online.sh turbo "$dir" --agent --concurrency "$levels" --llm-tokens-per-s 50 \
    --max-new-tokens 80 --cancel-fraction 0.25 --quiet --out "$dir/agent.json" "$@" | tail -5
  rm -f "$dir"/metrics_*
}
# agents_per_setting NAME FLAG LEVELS VALUE...: one agent_bench per VALUE (`chorus serve FLAG VALUE`;
# "none": without FLAG; "on": FLAG alone, a switch), back to back, into OUT_DIR/agent_NAME_VALUE;
# AGENT_SERVE_ARGS: options every one of those servers gets
agents_per_setting() {
  local name=$1 flag=$2 levels=$3 value args
  shift 3
  for value in "$@"; do
    case $value in none) args= ;; on) args=$flag ;; *) args="$flag $value" ;; esac
    SERVE_ARGS="${AGENT_SERVE_ARGS:-} $args" agent_bench "$out/agent_${name}_$value" "$levels"
  done
}
# admit_ahead_pair NAME: agent_bench at 16 and 64 connections with admissions ahead (the default), then without
# (`--no-t3-admit-ahead`), into OUT_DIR/agent_NAME_on and _off
admit_ahead_pair() {
  SERVE_ARGS="${AGENT_SERVE_ARGS:-}" agent_bench "$out/agent_$1_on" 16,64
  SERVE_ARGS="${AGENT_SERVE_ARGS:-} --no-t3-admit-ahead" agent_bench "$out/agent_$1_off" 16,64
}

case $what in
  tests)
    # only the files that hold gpu tests: collecting the rest would import the server's packages,
    # which a GPU machine may lack. Six pytest-xdist workers share the GPU (235 tests in about 4
    # minutes on an H200); the files that size memory from what the GPU has free run alone after.
    alone="tests/server/test_memory_plan.py tests/engine/test_engine_gpu.py"
    shared=$(grep -rl "pytest.mark.gpu" tests | sort | grep -v -e test_memory_plan.py -e test_engine_gpu.py)
    python3 -m pytest -q -p no:cacheprovider -n "${GPU_TEST_WORKERS:-6}" --dist loadfile -m gpu $shared 2>&1 \
      | tee "$out/gpu_tests.log"
    python3 -m pytest -q -p no:cacheprovider -m gpu $alone 2>&1 | tee -a "$out/gpu_tests.log" ;;
  bench-original)
    python3 -m chorus.cli bench t3 --variant original --reference --out "$out/bench_t3_original.json" 2>&1 | tail -80 ;;
  bench-turbo)
    python3 -m chorus.cli bench t3 --variant turbo --reference --out "$out/bench_t3_turbo.json" 2>&1 | tail -80 ;;
  offline-original|offline-turbo)
    python3 -m chorus.cli bench offline --variant "${what#offline-}" --reference \
      --out "$out/bench_offline_${what#offline-}.json" 2>&1 | tail -60 ;;
  stream-original|stream-turbo)
    python3 -m chorus.cli bench stream --variant "${what#stream-}" \
      --out "$out/bench_stream_${what#stream-}.json" 2>&1 | tail -80 ;;
  stream-turbo-prompt-cap)  # 64 and 256 streams with a first window over the whole voice prompt, then its
    # last 100 and 50 tokens, back to back (docs/vocoder.md, "First-window prompt")
    for k in none 100 50; do
      opt=(); [[ $k != none ]] && opt=(--vocoder-option "first_window_prompt_tokens=$k")
      python3 -m chorus.cli bench stream --variant turbo --concurrency 64,256 "${opt[@]}" \
        --out "$out/bench_stream_turbo_first_window_prompt_$k.json" 2>&1 | tail -20
    done ;;
  vocoder-turbo|vocoder-original)
    python3 -m chorus.cli bench vocoder --variant "${what#vocoder-}" \
      --out "$out/bench_vocoder_${what#vocoder-}.json" 2>&1 | tail -30 ;;
  vocoder-graphs)
    python3 scripts/gpu/vocoder_graphs.py --out "$out/vocoder_graphs.json" 2>&1 | tail -40 ;;
  stage-contention)  # CONTENTION_ARGS: more options (e.g. "--modes alone,graphed --green-sms 66,116 --green-capture")
    python3 scripts/gpu/stage_contention.py --variant turbo --batch-sizes 64 --steps 150 ${CONTENTION_ARGS:-} \
      --out "$out/stage_contention.json" 2>&1 | tail -10 ;;
  online-turbo-grpc)  # HTTP, then gRPC, against one turbo server at 1/64/256 clients (docs/grpc.md); needs grpcio
    GRPC_PORT=50051 bash scripts/gpu/online.sh turbo "$out" --concurrency 1,64,256 --duration-s "${ONLINE_SECONDS:-20}" \
      --client-processes "${CLIENT_PROCESSES:-4}" --quiet ;;
  timestamps-cost)  # what word timestamps cost T3's step (docs/timestamps.md): 2/64/256 rows of the original with CFG
    python3 -m chorus.cli bench t3 --variant original --batch-sizes 1,32,128 --no-workload --no-yardstick --timestamps \
      --out "$out/t3_timestamps_cost.json" 2>&1 | tail -12 ;;
  encoder-attention)  # the flow encoder's attention, plain ops then the fused kernel, twice, one pass of 32 x 250
    # tokens (turbo) each (docs/benchmarks.md, targets: the rule for turning the kernel on)
    for round in 1 2; do
      for ops in torch auto; do
        python3 -m chorus.cli bench vocoder --variant turbo --batch-sizes 32 --new-tokens 250 --no-yardstick \
          --encoder-attention-ops $ops --out "$out/bench_vocoder_encoder_attention_${ops}_$round.json" 2>&1 | tail -4
      done
    done ;;
  fp8-t3-turbo|fp8-t3-original)  # T3's decode step at 128 and 256 rows in bf16, then with FP8 linears (docs/engine.md,
    # "FP8 linears"); the second run also reports fp8_error on the card
    variant=${what#fp8-t3-}
    python3 -m chorus.cli bench t3 --variant "$variant" --batch-sizes 128,256 --no-workload --no-yardstick \
      --out "$out/t3_${variant}_bf16.json" 2>&1 | tail -6
    python3 -m chorus.cli bench t3 --variant "$variant" --batch-sizes 128,256 --no-workload --no-yardstick --fp8 t3 \
      --out "$out/t3_${variant}_fp8.json" 2>&1 | tail -12 ;;
  online-original|online-turbo)
    # CLIENT_PROCESSES (4): the processes the clients of a level are split between (one client
    # loop reading 256 streams lags by most of a second and adds that to what it measures)
    bash scripts/gpu/online.sh "${what#online-}" "$out" --duration-s "${ONLINE_SECONDS:-20}" \
      --client-processes "${CLIENT_PROCESSES:-4}" --quiet ;;
  overload-turbo)  # the 10x overload soak (docs/benchmarks.md, "Overload soak"); SOAK_S seconds (300),
    # SWITCH_MS the server's GIL switch interval (its default when unset), SOAK_CLIENTS the processes
    # that send the requests, the levels' and the arrivals (4: one process cannot send 10x of an H100's capacity)
    ${SWITCH_MS:+env CHORUS_SWITCH_INTERVAL_MS=$SWITCH_MS} bash scripts/gpu/online.sh turbo "$out" --concurrency 64,128 \
      --duration-s 20 --overload-multiple 10 --overload-duration-s "${SOAK_S:-300}" --overload-requests 200000 \
      --client-processes "${SOAK_CLIENTS:-4}" --timeout-s 120 --quiet ;;
  vc-original|vc-turbo)  # voice conversion of a 10 s source at batch 1 (docs/voice-conversion.md, "Speed")
    python3 -m chorus.cli bench vc --variant "${what#vc-}" --source-s 10 --out "$out/bench_vc_${what#vc-}.json" 2>&1 \
      | tail -5 ;;
  agent-turbo-prompt-cap)  # voice agents at 1, 16 and 64 connections with the first-window prompt cap
    # unset, 100 and 50, one server each, back to back (docs/decisions.md, "Vocoder: the first-window prompt cap stays off")
    agents_per_setting prompt --vocoder-first-window-prompt-tokens 1,16,64 none 100 50 ;;
  agent-turbo-first-window)  # voice agents at 16 and 64 connections with a stream's first vocoder window of
    # WINDOWS tokens ("20 14 10"), one server each, back to back: a smaller window means a first audio some T3
    # steps sooner and one vocoder pass more per stream (docs/vocoder.md, "Windows")
    agents_per_setting window --vocoder-first-window-tokens 16,64 ${WINDOWS:-20 14 10} ;;
  agent-turbo-admit-ahead)  # voice agents at 16 and 64 connections with admissions ahead (the default) and
    # without (`--no-t3-admit-ahead`), one server each, back to back (docs/engine.md, "One-step lookahead"): arrivals
    # admitted in the T3 step queued ahead instead of a synchronous admitting step per arrival; the bench's
    # server.stage_seconds splits t3_prefill
    admit_ahead_pair admit_ahead ;;
  agent-turbo-ramp)  # voice agents at 16 and 64 connections whose first turns start within one token interval
    # (as in agent-turbo: the level's burst), then spread over RAMP_S seconds (2), one server each, back to back
    # (docs/benchmarks.md, "Voice-agent latency"); the reports split first turns from later ones
    for ramp in 0 "${RAMP_S:-2}"; do
      SERVE_ARGS="${AGENT_SERVE_ARGS:-}" agent_bench "$out/agent_ramp_$ramp" 16,64 --ramp-s "$ramp"
    done ;;
  agent-turbo-queue-probe)  # the agent-turbo-admit-ahead pair with scripts/gpu/t3_queue_probe.py in both servers:
    # where a piece's time goes from the pipeline's submit to its first token (probe/probe_<pid>.json, one per
    # server, and probe_summary.json); the probe's wrappers add Python work, so compare phases within a run
    export CHORUS_PROBE_OUT="$out/probe" PYTHONPATH="$PWD/scripts/gpu/probe:$PYTHONPATH"
    mkdir -p "$CHORUS_PROBE_OUT"
    admit_ahead_pair probe_admit_ahead
    python3 scripts/gpu/t3_queue_probe.py summarize "$CHORUS_PROBE_OUT" --out "$out/probe_summary.json" >/dev/null ;;
  agent-turbo-mixed-graphs)  # voice agents at 1, 16 and 64 connections with T3's admitting steps replayed from
    # mixed CUDA graphs (`--t3-mixed-graph-tokens 256`, the default) and run eagerly (0), one server each, back to
    # back, ROUNDS times (1) (docs/engine.md, "CUDA graphs")
    for round in $(seq "${ROUNDS:-1}"); do
      agents_per_setting "mixed_r$round" --t3-mixed-graph-tokens 1,16,64 ${MIXED_TOKENS:-256 0}
    done ;;
  agent-turbo-admit-within-graphs)  # voice agents at 1, 16 and 64 connections with T3's steps that decode admitting
    # only what the largest mixed CUDA graph holds (the default) and without that bound (`--no-t3-admit-within-graphs`),
    # one server each, back to back, in ORDER ("on off") (docs/engine.md, "CUDA graphs")
    for setting in ${ORDER:-on off}; do
      case $setting in on) args= ;; off) args=--no-t3-admit-within-graphs ;; *) echo "ORDER: on or off"; exit 1 ;; esac
      SERVE_ARGS="${AGENT_SERVE_ARGS:-} $args" agent_bench "$out/agent_within_$setting" 1,16,64
    done ;;
  agent-turbo-switch)  # voice agents at 16 and 64 connections with the GIL's switch interval at SWITCHES ms
    # ("5 1 0.5"), one server each, back to back: every T3 admission is hundreds of eager PyTorch calls, each a
    # GIL hand-off that can wait a switch interval behind the event loop's or the vocoder's Python
    # (docs/server.md, "The GIL's switch interval")
    agents_per_setting switch --switch-interval-ms 16,64 ${SWITCHES:-5 1 0.5} ;;
  agent-turbo-profile)  # voice agents at LEVELS connections (64) while py-spy (PYSPY, a py-spy wheel among
    # WHEELS) samples every thread of the server, idle ones included, for PROFILE_S seconds (45) from its
    # readiness: agent_profile/pyspy.txt, collapsed stacks per thread, say where each stage thread waits, and
    # agent_profile/pyspy_summary.json sorts them by what each thread was doing (scripts/gpu/summarize_pyspy.py)
    pyspy=${PYSPY:-/tmp/chorus-site/bin/py-spy}
    [[ -x $pyspy ]] || { echo "no py-spy at $pyspy: put its wheel among WHEELS or set PYSPY"; exit 1; }
    mkdir -p "$out/agent_profile"
    ( for _ in $(seq 600); do curl -sf "http://127.0.0.1:${CHORUS_BENCH_PORT:-8123}/ready" >/dev/null && break; sleep 0.5; done
      "$pyspy" record --pid "$(pgrep -f 'chorus.cli serve' | head -1)" --threads --idle --nonblocking --rate 200 \
        --duration "${PROFILE_S:-45}" --format raw --output "$out/agent_profile/pyspy.txt" >"$out/agent_profile/pyspy.log" 2>&1 ) &
    SERVE_ARGS="${AGENT_SERVE_ARGS:-}" agent_bench "$out/agent_profile" "${LEVELS:-64}"
    wait
    python3 scripts/gpu/summarize_pyspy.py "$out/agent_profile/pyspy.txt" \
      --out "$out/agent_profile/pyspy_summary.json" >/dev/null ;;
  agent-turbo-headroom)  # voice agents at 64 and 256 connections under admission's real-time headroom
    # HEADROOMS ("1.25 1.6 2"), one server each, back to back: at 256 agents most admitted turns stalled with the
    # default 1.25 (one H100, 2026-12-05: 480 of 664 turns at 256 agents)
    agents_per_setting headroom --realtime-headroom 64,256 ${HEADROOMS:-1.25 1.6 2} ;;
  online-turbo-short-voice)  # the server over a 5.7 s voice clip (its first windows fall below every flow
    # bucket warm-up captures for 10 s prompts) with covering graphs on (4) and off, back to back
    # (docs/decisions.md, "Vocoder: shapes without a graph replay a larger one"); COVERS: the settings to run ("4 none")
    for c in ${COVERS:-4 none}; do
      mkdir -p "$out/short_voice_cover_$c"
      SERVE_ARGS="--vocoder-graph-cover-work $c" VOICE_CLIP=tests/data/sample-01.mp3 \
        bash scripts/gpu/online.sh turbo "$out/short_voice_cover_$c" --concurrency 1,16,64 --duration-s 15 \
        --client-processes 4 --quiet | tail -8
      rm -f "$out/short_voice_cover_$c"/metrics_*
    done ;;
  agent-turbo-conversation)  # voice agents in conversation: each hears its reply, then its user answers for 1-4 s
    # (`--listen --turn-gap-s 1 --turn-gap-max-s 4`), the first turns spread over RAMP_S (10) s, at CONV_LEVELS
    # (16,64,256) connections; before it, on a server of its own, the busy agents of agent-turbo at BUSY_LEVELS (16,64)
    # as the same machine's baseline (docs/voice-agents.md, "Measured latency"); AGENT_SEEDS: one conversation server each
    SERVE_ARGS="${AGENT_SERVE_ARGS:-}" agent_bench "$out/agent_busy" "${BUSY_LEVELS:-16,64}"
    for seed in ${AGENT_SEEDS:-0}; do
      SERVE_ARGS="${AGENT_SERVE_ARGS:-}" agent_bench "$out/agent_conversation_seed$seed" "${CONV_LEVELS:-16,64,256}" \
        --listen --turn-gap-s 1 --turn-gap-max-s 4 --ramp-s "${RAMP_S:-10}" --agent-seed "$seed"
    done ;;
  agent-turbo-listen)  # voice agents that hear each reply before their next turn (`--listen`), 3 turns each
    bash scripts/gpu/online.sh turbo "$out" --agent --listen --turns 3 --concurrency 1,16,64,256 \
      --llm-tokens-per-s 50 --max-new-tokens 80 --cancel-fraction 0.25 --quiet --out "$out/bench_agent_turbo_listen.json" ;;
  agent-original|agent-turbo)  # voice agents over the WebSocket (docs/benchmarks.md, "Voice-agent latency")
    bash scripts/gpu/online.sh "${what#agent-}" "$out" --agent --concurrency 1,16,64,256 --llm-tokens-per-s 50 \
      --max-new-tokens 80 --cancel-fraction 0.25 --quiet --out "$out/bench_agent_${what#agent-}.json" ;;
  two-models)  # turbo and original each alone, then both in one server, each benched while the other is idle;
    # the ratios of the two-model figures to the one-model ones (docs/models.md)
    bash scripts/gpu/models.sh two-models "$out" ;;
  swap-turbo)  # a hot swap to a second checkpoint under 64 clients (docs/benchmarks.md, "Swap under load")
    bash scripts/gpu/models.sh swap "$out" ;;
  scale-out-original|scale-out-turbo)
    bash scripts/gpu/scale_out.sh "${what#scale-out-}" "$out" ;;
  attention)
    python3 scripts/gpu/bench_attention.py --quick --out "$out/attention.json" 2>&1 | tail -40 ;;
  rope-kv)
    python3 scripts/gpu/bench_rope_kv.py "$out/rope_kv.json" 2>&1 | tail -20 ;;
  profile-original|profile-turbo)
    python3 scripts/gpu/profile_step.py --variant "${what#profile-}" --batch 224 --grow 180 \
      --out "$out/profile_${what#profile-}.json" 2>&1 | tail -30 ;;
  *) echo "unknown check $what" >&2; exit 2 ;;
esac
