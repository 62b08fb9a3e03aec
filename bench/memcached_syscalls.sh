#!/usr/bin/env bash
# Issue 18 item 7: system calls per memcached-tier hit, counted by `strace -c -f` on the proxy.
# Wall-clock runs are noisy on a shared machine; the number of syscalls a hit costs (and how it
# falls as concurrent gets share batched writes and reads) is not. Every hit is a memcached read
# (local_ttl = "0s"), over PAGES distinct 1 KB pages of the demo origin (so concurrent gets are
# for different keys, as in ws10k, not one key deduplicated).
#
#   bench/memcached_syscalls.sh                          # this tree's release build, loopback
#   bench/memcached_syscalls.sh --bin /tmp/lacquer-old   # another build, for an A/B
#   bench/memcached_syscalls.sh --latency-us 100         # memcached behind Toxiproxy, 0.1 ms each way
#   bench/memcached_syscalls.sh --connections 1          # one client: no batching possible
#
# Options: --connections C (wrk connections, default 50), --duration S (default 5), --pages N
# (default 2000), --threads T (proxy worker threads, default 2), --memory (no memcached: the
# memory-tier reference). strace slows the proxy down, so the rate it prints is not a benchmark;
# the syscalls per hit are the figure.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=$(pwd)/target/release/lacquer
CONNECTIONS=50
DURATION=5
PAGES=2000
THREADS=2
LATENCY_US=0
MEMORY_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --connections) CONNECTIONS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --pages) PAGES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --latency-us) LATENCY_US=$2; shift 2 ;;
    --memory) MEMORY_ONLY=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v strace >/dev/null || apt-get install -y -q strace >/dev/null
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer --bin demo-origin -q
[ -x target/release/demo-origin ] || cargo build --release --bin demo-origin -q

WORK=$(mktemp -d /tmp/mc-syscalls.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

ORIGIN=$(free_port)
target/release/demo-origin --listen 127.0.0.1:"$ORIGIN" --render-ms 0 >/dev/null 2>&1 & PIDS+=($!)
: >"$WORK/lacquer.toml"
if [ "$MEMORY_ONLY" = 0 ]; then
  MC=$(free_port)
  memcached -u nobody -l 127.0.0.1 -p "$MC" -U 0 -m 256 -t 1 & PIDS+=($!)
  wait_port "$MC" 5
  SERVER=$MC
  if [ "$LATENCY_US" -gt 0 ]; then
    if [ -n "${TOXIPROXY_BIN:-}" ]; then cp "$TOXIPROXY_BIN" "$WORK/toxiproxy"; else (cd bench/toxiproxy && go build -o "$WORK/toxiproxy" .); fi
    TP=$(free_port)
    "$WORK/toxiproxy" -host 127.0.0.1 -port "$TP" 2>"$WORK/toxiproxy.log" & PIDS+=($!)
    wait_port "$TP" 5
    SERVER=$(free_port)
    curl -sf -X POST "http://127.0.0.1:$TP/proxies" \
      -d "{\"name\":\"mc\",\"listen\":\"127.0.0.1:$SERVER\",\"upstream\":\"127.0.0.1:$MC\",\"enabled\":true}" >/dev/null
    for stream in upstream downstream; do
      curl -sf -X POST "http://127.0.0.1:$TP/proxies/mc/toxics" \
        -d "{\"name\":\"$stream\",\"type\":\"latency_us\",\"stream\":\"$stream\",\"attributes\":{\"latency\":$LATENCY_US}}" >/dev/null
    done
    wait_port "$SERVER" 5
  fi
  printf '[cache.memcached]\nservers = ["127.0.0.1:%s"]\nlocal_ttl = "0s"\nop_timeout = "1s"\n' "$SERVER" >>"$WORK/lacquer.toml"
fi
PORT=$(free_port)
"$BIN" --config "$WORK/lacquer.toml" --listen 127.0.0.1:"$PORT" --upstream 127.0.0.1:"$ORIGIN" \
  --threads "$THREADS" --memory-size 512MiB --access-log off >"$WORK/lacquer.log" 2>&1 &
LACQUER=$!
PIDS+=($LACQUER)
wait_port "$PORT" 10
# every page stored (in memcached, and a first hit read back) before counting
python3 - "$PORT" "$PAGES" <<'PY'
import http.client, sys
port, pages = int(sys.argv[1]), int(sys.argv[2])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for _ in range(2):
    for i in range(1, pages + 1):
        conn.request("GET", f"/page/{i}")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            sys.exit(f"/page/{i}: status {resp.status}")
PY
sleep 1
strace -c -f -p "$LACQUER" -o "$WORK/strace.txt" & STRACE=$!
sleep 1
wrk -t 1 -c "$CONNECTIONS" -d "${DURATION}s" -s bench/lua/random_pages.lua "http://127.0.0.1:$PORT" -- "$PAGES" >"$WORK/wrk.txt"
kill -INT "$STRACE"; wait "$STRACE" 2>/dev/null || true
REQUESTS=$(awk '/requests in/ { print $1 }' "$WORK/wrk.txt")
grep -q "Non-2xx" "$WORK/wrk.txt" && { echo "wrk saw errors:" >&2; cat "$WORK/wrk.txt" >&2; exit 1; }
TOTAL=$(awk '$NF == "total" { print $4 }' "$WORK/strace.txt")
MODE="memcached (loopback)"
[ "$LATENCY_US" -gt 0 ] && MODE="memcached via Toxiproxy, ${LATENCY_US} us each way"
[ "$MEMORY_ONLY" = 1 ] && MODE="memory tier"
echo "$(basename "$BIN"), $MODE, $CONNECTIONS connections: $REQUESTS hits, $(python3 -c "print(f'{$TOTAL / $REQUESTS:.2f}')") syscalls per hit"
awk -v n="$REQUESTS" 'NR > 2 && $NF != "total" && $4 ~ /^[0-9]+$/ && $4 / n >= 0.01 { printf "  %-16s %6.2f per hit\n", $NF, $4 / n }' "$WORK/strace.txt"
