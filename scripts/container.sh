#!/usr/bin/env bash
# Build Chorus's container image (Containerfile) with podman and test it (docs/deploy.md).
#   bash scripts/container.sh wheelhouse   # build/wheelhouse: Chorus, torch and every dependency as wheels
#   bash scripts/container.sh build        # the wheelhouse, the base image if missing, then the image
#   bash scripts/container.sh test         # run the image and check it (below); removes what it made
# Settings (environment):
#   CHORUS_IMAGE           the image's name (default localhost/chorus:cpu)
#   CHORUS_CONTAINER_BASE  the base image (default localhost/debian-min:bookworm, which is made
#                          from Debian's packages with debootstrap when missing; any other is
#                          pulled by podman, e.g. docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04)
#   CHORUS_TORCH_INDEX     torch's index (default PyTorch's CPU index; scripts/install-torch.sh)
#   CHORUS_CONTAINER_EXTRAS  Chorus's extras in the image, e.g. "ray,gpu-metrics" (default none)
#   CHORUS_CONTAINER_APT   more Debian packages for the image's runtime, e.g. wget (default none)
#   PYTHON                 the Python that makes the wheelhouse; its minor version must be the
#                          base image's (python3; Debian bookworm has 3.11, Ubuntu 24.04 3.12)
# `test` starts the image with the quick start's random-weight Turbo checkpoint mounted
# (.ckpt/turbo-random, written by scripts/serve.sh; made for the run, with the image, if absent),
# waits for /ready, runs the image's health check, speaks one sentence, uploads one voice clip
# (tests/data/sample-01-02.flac, or the file given after `test`), checks the audio, then sends
# SIGTERM while a stream is under way and checks that the stream ends whole and the server
# drains and exits 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
IMAGE=${CHORUS_IMAGE:-localhost/chorus:cpu}
BASE=${CHORUS_CONTAINER_BASE:-localhost/debian-min:bookworm}
PY=${PYTHON:-python3}
WHEELHOUSE=build/wheelhouse
# runc: crun, podman's default runtime, does not run on every cgroup layout. The open-file and
# process limits are set explicitly: podman's defaults can exceed what the host lets a container
# set (setrlimit is then refused). Open files: the host's own limit; 4096 processes (threads) are
# plenty for one server.
PODMAN=(podman)
command -v runc >/dev/null 2>&1 && PODMAN+=(--runtime runc)
NOFILE=$(ulimit -Hn)
[[ "$NOFILE" =~ ^[0-9]+$ ]] || NOFILE=65536
LIMITS=(--ulimit "nofile=$NOFILE:$NOFILE" --ulimit nproc=4096:4096)

say() { echo "[container.sh $(date +%T)] $*"; }
fail() { echo "container.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || fail "$1 is not installed ($2)"; }

wheelhouse() {
  local start=$SECONDS pyver extras=${CHORUS_CONTAINER_EXTRAS:-}
  pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  say "wheelhouse for Python $pyver in $WHEELHOUSE (torch from ${CHORUS_TORCH_INDEX:-the CPU index})"
  rm -rf "$WHEELHOUSE"
  mkdir -p "$WHEELHOUSE"
  local log=build/wheelhouse.log
  # torch as scripts/install-torch.sh installs it; then Chorus as a wheel and wheels of all it
  # needs (built here where a project publishes none); pip's output goes to the log
  if ! { PYTHON="$PY" bash scripts/install-torch.sh --wheel-dir "$WHEELHOUSE" &&
         "$PY" -m pip wheel -q --disable-pip-version-check -w "$WHEELHOUSE" --find-links "$WHEELHOUSE" \
           "$WHEELHOUSE"/torch-*.whl ".${extras:+[$extras]}"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "making the wheelhouse failed (the log: $log)"
  fi
  echo "$pyver" >"$WHEELHOUSE/PYTHON"
  echo "chorus-tts${extras:+[$extras]}" >"$WHEELHOUSE/requirements.txt"
  say "wheelhouse: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels," \
    "$(du -sh "$WHEELHOUSE" | cut -f1), $((SECONDS - start)) s"
}

base_image() {
  if "${PODMAN[@]}" image exists "$BASE"; then
    return
  fi
  [[ "$BASE" == localhost/debian-min:* ]] || return 0  # a registry's image: podman build pulls it
  need debootstrap "apt-get install debootstrap"
  [[ $(id -u) == 0 ]] || fail "making the base image $BASE with debootstrap needs root: run this build" \
    "as root once, or name a base image podman can pull (CHORUS_CONTAINER_BASE)"
  local suite=${BASE#localhost/debian-min:} rootfs start=$SECONDS
  rootfs=$(mktemp -d)
  say "base image $BASE: debootstrap --variant=minbase $suite"
  debootstrap --variant=minbase "$suite" "$rootfs" >"$rootfs.log" 2>&1 || {
    tail -n 20 "$rootfs.log" >&2; rm -rf "$rootfs" "$rootfs.log"; fail "debootstrap failed"; }
  # without the downloaded packages and package lists (the image's build fetches its own)
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "${PODMAN[@]}" import -q - "$BASE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  say "base image $BASE made in $((SECONDS - start)) s"
}

build() {
  need podman "apt-get install podman runc"
  local start=$SECONDS
  wheelhouse
  base_image
  say "building $IMAGE from $BASE"
  local old
  old=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  "${PODMAN[@]}" build --format docker --network=host "${LIMITS[@]}" -f Containerfile \
    --build-arg "BASE=$BASE" --build-arg "APT_PACKAGES=${CHORUS_CONTAINER_APT:-}" -t "$IMAGE" .
  # what the build left behind: the build stage's image and the image this one replaced (if
  # nothing else names or uses it)
  "${PODMAN[@]}" image prune -f --filter label=chorus.stage=build >/dev/null
  if [[ -n "$old" && "$old" != $("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE") ]] &&
     [[ $("${PODMAN[@]}" image inspect --format '{{len .RepoTags}}' "$old" 2>/dev/null) == 0 ]]; then
    "${PODMAN[@]}" rmi "$old" >/dev/null 2>&1 || true
  fi
  say "built $IMAGE in $((SECONDS - start)) s; size $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE" \
    | awk '{printf "%.0f MB", $1 / 1e6}')"
}

# -- test --------------------------------------------------------------------------------------
NAME=chorus-test-$$
VOLUME=chorus-test-voices-$$
MADE_CKPT=""
OUT=""

cleanup() {
  "${PODMAN[@]}" rm -f -v -t 0 "$NAME" >/dev/null 2>&1 || true  # -v: and its /cache volume
  "${PODMAN[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  [[ -z "$MADE_CKPT" ]] || rm -rf "$MADE_CKPT"
  [[ -z "$OUT" ]] || rm -rf "$OUT"
}

# quiet COMMAND...: without podman's complaint that it cannot time the health check where systemd
# is not running (the test runs the image's check itself)
quiet() {
  "$@" 2> >(grep -v "unable to get systemd connection" >&2)
}

logs_and_fail() {
  echo "--- the container's log ---" >&2
  "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 40 >&2 || true
  fail "$*"
}

# wait_for SECONDS WHAT COMMAND...: run COMMAND every 0.5 s until it succeeds; fail after SECONDS
# or at once when the container has stopped
wait_for() {
  local limit=$1 what=$2 start=$SECONDS
  shift 2
  until "$@"; do
    [[ $("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME") == true ]] ||
      logs_and_fail "the container stopped while waiting for $what"
    (( SECONDS - start < limit )) || logs_and_fail "no $what after $limit s"
    sleep 0.5
  done
}

# check_wav FILE MIN_SECONDS: a 24 kHz mono 16-bit WAV with at least MIN_SECONDS of audio that is not silence
check_wav() {
  "$PY" - "$1" "$2" <<'EOF'
import array, sys, wave
with wave.open(sys.argv[1]) as w:
    rate, channels, width, frames = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
    samples = array.array("h", w.readframes(frames))
seconds = len(samples) / rate
assert (rate, channels, width) == (24000, 1, 2), f"not 24 kHz mono 16-bit: {rate} Hz, {channels} ch, {width} B"
assert seconds >= float(sys.argv[2]), f"only {seconds:.2f} s of audio"
assert max(abs(s) for s in samples) > 100, "the audio is silence"
print(f"{seconds:.2f} s of 24 kHz audio, peak {max(abs(s) for s in samples)}")
EOF
}

# ready URL: whether /ready says 200; fails the test at once when the server's start failed
ready() {
  local body
  body=$(curl -s "$1/ready") || return 1
  [[ "$body" != *'"state":"failed"'* ]] || logs_and_fail "the server's start failed: $body"
  [[ "$body" == *'"ready":true'* ]]
}

# in_flight URL: whether the server has a request of normal priority in flight (its /metrics;
# the canaries run at high priority)
in_flight() {
  curl -s "$1/metrics" | grep -Eq '^chorus_requests_in_flight\{[^}]*priority="normal"[^}]*\} [1-9]'
}

test_image() {
  need podman "apt-get install podman runc"
  need curl "apt-get install curl"
  local clip=${1:-tests/data/sample-01-02.flac} ckpt=.ckpt/turbo-random port url start=$SECONDS
  [[ -f "$clip" ]] || fail "no voice clip at $clip"
  "${PODMAN[@]}" image exists "$IMAGE" || fail "no image $IMAGE: run bash scripts/container.sh build first"
  trap cleanup EXIT
  OUT=$(mktemp -d)
  if [[ ! -f "$ckpt/CHORUS_RANDOM_WEIGHTS.txt" ]]; then
    MADE_CKPT=$(mktemp -d)
    chmod 755 "$MADE_CKPT"
    ckpt=$MADE_CKPT/turbo-random
    say "writing a random-weight Turbo checkpoint (as scripts/serve.sh does) with the image"
    quiet "${PODMAN[@]}" run --rm "${LIMITS[@]}" --user 0 --entrypoint chorus -v "$MADE_CKPT:/ckpt" "$IMAGE" \
      checkpoint random --variant turbo --out /ckpt/turbo-random --seed 0
  fi
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  url=http://127.0.0.1:$port
  say "starting $IMAGE as $NAME on $url"
  # random weights always speak the cap on speech tokens: 150 (6 s per text chunk) keeps the CPU
  # run short but the stream long enough to be under way at SIGTERM; a long grace lets it finish
  # however busy the machine is
  quiet "${PODMAN[@]}" run -d --name "$NAME" "${LIMITS[@]}" -p "127.0.0.1:$port:8000" \
    -v "$(cd "$ckpt" && pwd):/models/turbo:ro" -v "$VOLUME:/voices" "$IMAGE" \
    --variant turbo --checkpoint /models/turbo --max-new-tokens 150 --shutdown-grace-s 300 --log-format text >/dev/null
  wait_for 900 "200 from /ready" ready "$url"
  say "ready after $((SECONDS - start)) s"
  local health
  health=$("${PODMAN[@]}" healthcheck run "$NAME" 2>&1) ||
    logs_and_fail "the image's health check fails on a ready server: $health"
  say "the image's health check passes"

  curl -sf "$url/v1/audio/speech" -H 'Content-Type: application/json' -o "$OUT/hello.wav" \
    -d '{"model": "chatterbox-turbo", "input": "Hello from a container.", "response_format": "wav"}' ||
    logs_and_fail "the speech request failed"
  local audio
  audio=$(check_wav "$OUT/hello.wav" 5.0) || logs_and_fail "the speech is not the audio expected"
  say "speech: $audio"

  local voice
  voice=$(curl -sf "$url/v1/voices" -F "file=@$clip" -F name=container-test |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["id"])') || logs_and_fail "the voice upload failed"
  curl -sf "$url/v1/voices/$voice" -o /dev/null || logs_and_fail "the uploaded voice $voice is not listed"
  say "voice uploaded: $voice"

  # SIGTERM while a stream is under way (admitted: counted in chorus_requests_in_flight; 6 s of
  # audio take tens of seconds on a CPU): the stream must end whole (curl sees the chunked body's
  # end; all the audio), the server must say it is draining, end nothing early and exit 0
  curl -sfN "$url/v1/audio/speech" -H 'Content-Type: application/json' -o "$OUT/stream.wav" \
    -d '{"model": "chatterbox-turbo", "voice": "'"$voice"'", "input": "Goodbye from a container.",'\
'       "response_format": "wav"}' &
  local stream=$! status=0
  wait_for 300 "the stream in flight" in_flight "$url"
  kill -0 "$stream" 2>/dev/null || logs_and_fail "the stream ended before SIGTERM could be sent"
  "${PODMAN[@]}" kill --signal TERM "$NAME" >/dev/null
  say "SIGTERM sent while the stream is in flight" \
    "($(stat -c %s "$OUT/stream.wav" 2>/dev/null || echo 0) bytes received)"
  wait "$stream" || logs_and_fail "the stream under way at SIGTERM was cut (curl exit $?)"
  status=$("${PODMAN[@]}" wait "$NAME")
  local log
  log=$("${PODMAN[@]}" logs "$NAME" 2>&1)
  [[ "$status" == 0 ]] || logs_and_fail "the server exited with $status after SIGTERM, not 0"
  grep -q "draining: 1 request(s) in flight" <<<"$log" || logs_and_fail "the server did not say it was draining"
  ! grep -q "shutdown grace of .* is over" <<<"$log" || logs_and_fail "the drain ended streams early"
  audio=$(check_wav "$OUT/stream.wav" 5.0) || logs_and_fail "the stream's audio is not whole"
  say "stream under SIGTERM: $audio"
  say "drained and exited 0; test passed in $((SECONDS - start)) s"
}

case "${1:-}" in
  wheelhouse) wheelhouse ;;
  build) build ;;
  test) shift; test_image "$@" ;;
  *) echo "usage: bash scripts/container.sh wheelhouse|build|test [VOICE_CLIP]" >&2; exit 2 ;;
esac
