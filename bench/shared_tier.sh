#!/usr/bin/env bash
# Issue 3 experiment: two Lacquer nodes behind a round-robin HAProxy front, a working set of
# 20,000 pages larger than one node's memory tier. Runs twice, with and without the shared
# memcached tier, and reports hit ratio and origin requests. Everything on 127.0.0.1:29xxx.
# Usage: bench/shared_tier.sh [seconds per run, default 20] [runs per mode, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}; RUNS=${2:-3}; PAGES=${PAGES:-20000}; MEM=${MEM:-8MiB}
command -v haproxy >/dev/null && command -v wrk >/dev/null && command -v memcached >/dev/null || {
  echo "needs haproxy, wrk and memcached (apt-get install haproxy wrk memcached)" >&2; exit 1; }
cargo build --release --bins -q
BIN=target/release; DIR=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 did not open" >&2; exit 1; }

cat > "$DIR/haproxy.cfg" <<CFG
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
frontend front
  bind 127.0.0.1:29000
  default_backend nodes
backend nodes
  balance roundrobin
  http-reuse always
  server a 127.0.0.1:29001
  server b 127.0.0.1:29002
CFG

run_mode() { # $1 = shared|isolated, $2 = run number
  local mode=$1 run=$2 extra="" pids=()
  "$BIN/demo-origin" --listen 127.0.0.1:29100 --render-ms 2 >/dev/null 2>&1 & pids+=($!)
  if [ "$mode" = shared ]; then
    memcached -p 29200 -l 127.0.0.1 -U 0 -m 128 -u root & pids+=($!)
    wait_port 29200
    extra=$'[cache.memcached]\nservers = ["127.0.0.1:29200"]'
  fi
  for node in 1 2; do
    cat > "$DIR/node$node.toml" <<TOML
listen = ["127.0.0.1:2900$node"]
upstream = "127.0.0.1:29100"
threads = 1
[log]
access = "$DIR/access$node.log"
[cache]
memory_size = "$MEM"
max_object_size = "1MiB"
$extra
TOML
    : > "$DIR/access$node.log"
    "$BIN/lacquer" --config "$DIR/node$node.toml" --log-level warn & pids+=($!)
  done
  haproxy -f "$DIR/haproxy.cfg" -db >/dev/null 2>&1 & pids+=($!)
  wait_port 29100; wait_port 29001; wait_port 29002; wait_port 29000
  PIDS=("${pids[@]}")
  local out; out=$(wrk -t2 -c64 -d"${SECS}s" -s bench/lua/random_pages.lua http://127.0.0.1:29000/ -- "$PAGES")
  sleep 1
  local total misses rps
  total=$(cat "$DIR"/access*.log | wc -l)
  misses=$(cat "$DIR"/access*.log | grep -c 'cache=miss' || true)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  awk -v m="$mode" -v r="$run" -v t="$total" -v o="$misses" -v s="$rps" \
    'BEGIN { printf "%-8s run %d: %8d requests, %7d origin requests, hit ratio %5.1f%%, %8.0f req/s\n", m, r, t, o, 100*(t-o)/t, s }'
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
echo "two nodes, memory tier $MEM each, $PAGES pages, ${SECS}s per run"
for run in $(seq "$RUNS"); do
  run_mode isolated "$run"
  run_mode shared "$run"
done
