# Sourced by the install scripts (scripts/install-product-env.sh, scripts/install-test-env.sh).
# step "what" command...: print "what", run the command with its output appended to $LOG, say
# every 10 s that it is still running (with the log's latest line), print how long it took, and
# on failure show the end of $LOG and exit with the command's status.
step() {
  local label=$1 start=$SECONDS next=10 pid status=0
  shift
  echo "$label (log: $LOG)"
  "$@" >>"$LOG" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if (( SECONDS - start >= next )); then
      local last
      last=$(tail -n 1 "$LOG" 2>/dev/null | cut -c1-100)
      echo "  ... $(( SECONDS - start )) s${last:+: $last}"
      next=$(( next + 10 ))
    fi
    sleep 1
  done
  wait "$pid" || status=$?
  if (( status != 0 )); then
    echo "  FAILED after $(( SECONDS - start )) s (exit $status); the end of $LOG:" >&2
    tail -n 20 "$LOG" >&2
    exit "$status"
  fi
  echo "  done in $(( SECONDS - start )) s"
}
