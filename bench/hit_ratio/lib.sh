# shellcheck shell=bash
# Process helpers of bench/hit_ratio.sh and bench/shared_tier.sh (sourced). Daemons are started
# in their own session and stopped with their descendants, each by PID, never by name.

# tree PID: the PID and all its descendants.
tree() { echo "$1"; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$c"; done; }

# stop_tree PID: SIGINT then SIGTERM to the tree, SIGKILL what is left after 10 s. SIGINT is
# Lacquer's stop-at-once (its SIGTERM drains); the others stop on SIGTERM, and a background job
# of a script starts with SIGINT ignored, so Python and HAProxy would not see SIGINT at all.
stop_tree() {
  [ -n "$1" ] || return 0
  local all; all=$(tree "$1")
  # shellcheck disable=SC2086
  kill -INT $all 2>/dev/null || true
  # shellcheck disable=SC2086
  kill -TERM $all 2>/dev/null || true
  for _ in $(seq 100); do
    # shellcheck disable=SC2086
    kill -0 $all 2>/dev/null || return 0; sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $all 2>/dev/null || true
}

# wait_port PORT: until 127.0.0.1:PORT accepts (60 s at most).
wait_port() {
  for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "port $1 did not open" >&2; return 1
}

# pss_mb PID...: PSS of the process trees in MB (shared pages counted once).
pss_mb() {
  local kb=0 p root
  for root in "$@"; do
    for p in $(tree "$root"); do
      kb=$((kb + $(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)))
    done
  done
  echo $((kb / 1024))
}
