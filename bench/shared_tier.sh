#!/usr/bin/env bash
# Issue 3, made fair in issue 18 item 5: N Lacquer nodes behind a round-robin HAProxy front, the
# same total cache memory either way:
#   isolated  each node a memory tier of NODE_MB, nothing shared         (N x NODE_MB)
#   shared    each node a memory tier of LOCAL_MB, plus one memcached     (N x LOCAL_MB
#             of N x (NODE_MB - LOCAL_MB) MB that every node reads/writes  + N x (NODE_MB - LOCAL_MB))
# for N in NODES. The claim under test: pooling beats duplicating (isolated nodes each keep their
# own copy of the popular objects), and the gain grows with N. The workload is bench/hit_ratio.sh's
# (Zipf popularity over 1,000,000 URLs of 2 KB-1 MB, a fixed trace, seed below), replayed from
# empty caches; the origin (bench/hit_ratio/origin.py) counts what reaches it.
#
# Usage: bench/shared_tier.sh [report.md]
# Environment: NODES ("2 4 8"), NODE_MB (32), LOCAL_MB (8), REQUESTS (200000), ZIPF (0.9), SEED
# (18), OBJECTS (1000000), CONNS (32), LACQUER (a release binary; default: cargo build --release).
# Ports 127.0.0.1:29000-29200. About 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hit_ratio/lib.sh
. bench/hit_ratio/lib.sh
REPORT=${1:-}
NODES=${NODES:-"2 4 8"}; NODE_MB=${NODE_MB:-32}; LOCAL_MB=${LOCAL_MB:-8}; REQUESTS=${REQUESTS:-200000}
ZIPF=${ZIPF:-0.9}; SEED=${SEED:-18}; OBJECTS=${OBJECTS:-1000000}; CONNS=${CONNS:-32}
command -v haproxy >/dev/null && command -v memcached >/dev/null || {
  echo "needs haproxy and memcached (apt-get install haproxy memcached)" >&2; exit 1; }
if [ -z "${LACQUER:-}" ]; then cargo build --release --bin lacquer -q; LACQUER=$(pwd)/target/release/lacquer; fi
DIR=$(mktemp -d /tmp/shared-tier.XXXX); ORIGIN_PORT=29100; MC_PORT=29200
ORIGIN_PID=""; PIDS=()
stop_run() { local p; for p in "${PIDS[@]:-}"; do stop_tree "$p"; done; PIDS=(); }
cleanup() { stop_run; stop_tree "$ORIGIN_PID"; rm -rf "$DIR"; }
trap cleanup EXIT

# memcached_stats: the `stats` lines that say what the pool held and dropped, as JSON fields.
memcached_stats() {
  exec 3<>"/dev/tcp/127.0.0.1/$MC_PORT"
  printf 'stats\r\nquit\r\n' >&3
  tr -d '\r' <&3 | awk '$1 == "STAT" && $2 ~ /^(limit_maxbytes|bytes|curr_items|evictions|get_hits|get_misses)$/ {
    printf "%s\"mc_%s\": %s", sep, $2, $3; sep = ", " }'
  exec 3<&-
}

run_mode() { # $1 = isolated|shared, $2 = node count
  local mode=$1 n=$2 node mem extra="" servers=""
  if [ "$mode" = shared ]; then
    mem=$LOCAL_MB
    setsid memcached -p "$MC_PORT" -l 127.0.0.1 -U 0 -t 2 -m $((n * (NODE_MB - LOCAL_MB))) -u root \
      >"$DIR/memcached.log" 2>&1 </dev/null &
    PIDS+=($!)
    wait_port "$MC_PORT"
    extra=$'[cache.memcached]\nservers = ["127.0.0.1:'"$MC_PORT"$'"]'
  else
    mem=$NODE_MB
  fi
  for node in $(seq "$n"); do
    cat > "$DIR/node$node.toml" <<TOML
listen = ["127.0.0.1:$((29000 + node))"]
upstream = "127.0.0.1:$ORIGIN_PORT"
threads = 1
[log]
access = "off"
[cache]
memory_size = "${mem}MiB"
max_object_size = "2MiB"
$extra
TOML
    setsid "$LACQUER" --config "$DIR/node$node.toml" --log-level warn >"$DIR/node$node.log" 2>&1 </dev/null &
    PIDS+=($!)
    servers+="  server n$node 127.0.0.1:$((29000 + node))"$'\n'
  done
  cat > "$DIR/haproxy.cfg" <<CFG
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend front
  bind 127.0.0.1:29000
  default_backend nodes
backend nodes
  balance roundrobin
  http-reuse always
$servers
CFG
  setsid haproxy -f "$DIR/haproxy.cfg" -db >"$DIR/haproxy.log" 2>&1 </dev/null &
  PIDS+=($!)
  for node in $(seq "$n"); do wait_port $((29000 + node)); done
  wait_port 29000
  python3 bench/hit_ratio/replay.py "$DIR/trace.txt" 127.0.0.1:29000 "127.0.0.1:$ORIGIN_PORT" \
    --conns "$CONNS" --label "$mode n=$n" --json "$DIR/results.jsonl"
  local stats="" nodes_pss mc_pss=0
  nodes_pss=$(pss_mb "${PIDS[@]:$([ "$mode" = shared ] && echo 1 || echo 0):$n}")
  if [ "$mode" = shared ]; then stats=", $(memcached_stats)"; mc_pss=$(pss_mb "${PIDS[0]}"); fi
  echo "{\"label\": \"$mode n=$n\", \"mode\": \"$mode\", \"nodes\": $n, \"local_mb\": $mem, \"total_mb\": $((n * NODE_MB)), \"nodes_pss_mb\": $nodes_pss, \"memcached_pss_mb\": $mc_pss$stats}" \
    >> "$DIR/memory.jsonl"
  stop_run
}

setsid python3 bench/hit_ratio/origin.py "$ORIGIN_PORT" >"$DIR/origin.log" 2>&1 </dev/null &
ORIGIN_PID=$!
wait_port "$ORIGIN_PORT"
python3 bench/hit_ratio/make_trace.py "$DIR/trace.txt" --objects "$OBJECTS" --requests "$REQUESTS" \
  --zipf "$ZIPF" --seed "$SEED" | tee "$DIR/traces.txt"
echo "N nodes x $NODE_MB MB: isolated (memory tier $NODE_MB MB each) vs shared (memory tier $LOCAL_MB MB each + memcached of the rest)"
for n in $NODES; do
  run_mode isolated "$n"
  run_mode shared "$n"
done
python3 bench/hit_ratio/tier_report.py "$DIR/results.jsonl" "$DIR/memory.jsonl" "$DIR/traces.txt" \
  --title "Shared tier at equal memory, $(date -u +%Y-%m-%d)" \
  --setup "N nodes x $NODE_MB MB; isolated: memory tier $NODE_MB MB each; shared: memory tier $LOCAL_MB MB each + one memcached of N x $((NODE_MB - LOCAL_MB)) MB. $REQUESTS requests, zipf s=$ZIPF over $OBJECTS URLs, seed $SEED, $CONNS connections through HAProxy (round robin)." \
  > "$DIR/report.md"
cat "$DIR/report.md"
if [ -n "$REPORT" ]; then cp "$DIR/report.md" "$REPORT"; fi
