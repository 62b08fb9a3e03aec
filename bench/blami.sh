#!/usr/bin/env bash
# The blami experiment (issue 6): an origin that serves ONE request at a time (50 ms each),
# replicated 1, 2, 4 and 8 times behind Lacquer, on uncacheable URLs. For each replica count,
# round_robin and least_loaded, with all replicas equal and with one replica 5x slower.
# Ideal throughput with n equal replicas is n * 1000/DELAY req/s; with one 5x slower replica it
# is (n - 1 + 1/5) * 1000/DELAY.
# Usage: bench/blami.sh [seconds per cell, default 30] [replica counts, default "1 2 4 8"]
# Short check: bench/blami.sh 3 "1 2"
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SECS=${1:-30}; COUNTS=${2:-"1 2 4 8"}; DELAY=${DELAY:-50}; CONNS=${CONNS:-64}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
cargo build --release --bins -q
BIN=target/release; DIR=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
cat > "$DIR/unique.lua" <<'LUA'
-- every request a new URL: nothing is cacheable anyway, and nothing coalesces
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/item/" .. math.random(1, 1e9) .. "-" .. counter)
end
LUA

cell() { # $1 = replicas, $2 = algorithm, $3 = equal|slow
  local n=$1 algo=$2 variant=$3 pids=() upstreams="" port
  for i in $(seq "$n"); do
    port=$((29300 + i))
    local factor=1
    if [ "$variant" = slow ] && [ "$i" = 1 ]; then factor=5; fi
    "$BIN/serial-origin" --listen "127.0.0.1:$port" --delay-ms "$DELAY" --slow-factor "$factor" & pids+=($!)
    upstreams+=$'[[upstreams]]\naddress = "127.0.0.1:'"$port"$'"\n'
  done
  cat > "$DIR/lacquer.toml" <<TOML
listen = ["127.0.0.1:29300"]
threads = 2
$upstreams
[balancer]
algorithm = "$algo"
[balancer.timeouts]
first_byte = "60s"
[log]
access = "off"
TOML
  "$BIN/lacquer" --config "$DIR/lacquer.toml" --log-level error 2>>"$DIR/lacquer.err" & pids=($! "${pids[@]}")
  PIDS=("${pids[@]}")
  for i in $(seq "$n"); do wait_port $((29300 + i)); done
  wait_port 29300
  local out rps ideal errors
  out=$(wrk -t2 -c"$CONNS" -d"${SECS}s" --timeout 30s -s "$DIR/unique.lua" http://127.0.0.1:29300/)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  errors=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
  [ -n "$errors" ] && echo "  ($n $algo $variant: $errors)" >&2
  if [ "$variant" = slow ]; then
    ideal=$(awk -v n="$n" -v d="$DELAY" 'BEGIN { printf "%.1f", (n - 1 + 0.2) * 1000 / d }')
  else
    ideal=$(awk -v n="$n" -v d="$DELAY" 'BEGIN { printf "%.1f", n * 1000 / d }')
  fi
  awk -v n="$n" -v a="$algo" -v v="$variant" -v r="$rps" -v i="$ideal" \
    'BEGIN { printf "| %2d | %-12s | %-5s | %8.1f | %8.1f | %5.0f%% |\n", n, a, v, r, i, (i > 0 ? 100 * r / i : 0) }'
  # lacquer first (it is first in the list), so it does not report the origins going away
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; sleep 0.1; done
  wait 2>/dev/null || true
  PIDS=()
  sleep 0.5
}

echo "serial origin: one request at a time, ${DELAY} ms each; wrk ${CONNS} connections, ${SECS}s per cell"
echo "| replicas | algorithm | variant | req/s | ideal req/s | of ideal |"
echo "|---:|---|---|---:|---:|---:|"
for n in $COUNTS; do
  for variant in equal slow; do
    for algo in round_robin least_loaded; do
      cell "$n" "$algo" "$variant"
    done
  done
done
