#!/usr/bin/env bash
# How long a purge made through one node takes to stop another node serving the object, under
# load: the bound docs/benchmarks.md quotes.
#
#   bench/purge_bound.sh                    # 100 purges, wrk loading both nodes meanwhile
#   bench/purge_bound.sh --purges 300 --poll-interval 100ms --no-load
#
# Three memcached servers and two Lacquer nodes (this tree's release build, local_ttl 30 s, so
# only the purge can explain B dropping its copy) in front of the demo origin. Each round: a page
# is fetched through A (stored, written to memcached), fetched through B (B keeps a copy), purged
# through A with PURGE (which does not wait for B); then B is asked every 2 ms until it answers
# with a new rendering. The time from the PURGE's answer to B's first new answer is one sample.
# wrk (2 connections per node, 1 KB hot hits) runs throughout unless --no-load.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
PURGES=100
POLL=250ms
LOAD=1
while [ $# -gt 0 ]; do
  case $1 in
    --purges) PURGES=$2; shift 2 ;;
    --poll-interval) POLL=$2; shift 2 ;;
    --no-load) LOAD=0; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
cargo build --release --bin lacquer --bin demo-origin -q
WORK=$(mktemp -d /tmp/purge-bound.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

ORIGIN=127.0.0.1:$(free_port)
target/release/demo-origin --listen "$ORIGIN" --render-ms 0 >/dev/null 2>&1 &
PIDS+=($!)
SERVERS=()
for _ in 1 2 3; do
  port=$(free_port)
  memcached -p "$port" -l 127.0.0.1 -U 0 -m 64 -u root &
  PIDS+=($!)
  SERVERS+=("\"127.0.0.1:$port\"")
done
NODES=()
for name in A B; do
  port=$(free_port)
  cat >"$WORK/$name.toml" <<EOF
listen = ["127.0.0.1:$port"]
upstream = "$ORIGIN"
threads = 1
[log]
access = "off"
[invalidation]
poll_interval = "$POLL"
node_name = "$name"
[cache.memcached]
servers = [$(IFS=,; echo "${SERVERS[*]}")]
local_ttl = "30s"
EOF
  target/release/lacquer --config "$WORK/$name.toml" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  NODES+=("$port")
done
for port in "${NODES[@]}"; do
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/page/warm" && break || sleep 0.1
  done
done
if [ "$LOAD" = 1 ]; then
  for port in "${NODES[@]}"; do
    wrk -t1 -c2 -d1h "http://127.0.0.1:$port/page/hot" >/dev/null 2>&1 &
    PIDS+=($!)
  done
fi

python3 - "${NODES[0]}" "${NODES[1]}" "$PURGES" <<'PY'
import http.client, sys, time
a, b, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def ask(port, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, headers={"Host": "bench.example"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body

samples = []
for i in range(rounds):
    path = f"/page/purge-{i}"
    _, old = ask(a, "GET", path)
    time.sleep(0.05)  # the write to memcached
    _, from_b = ask(b, "GET", path)
    if from_b != old:
        continue  # B filled it itself: not a copy of A's
    status, _ = ask(a, "PURGE", path)
    purged = time.monotonic()
    if status != 200:
        sys.exit(f"PURGE answered {status}")
    while ask(b, "GET", path)[1] == old:
        if time.monotonic() - purged > 30:
            sys.exit("B still served the purged page after 30 s")
        time.sleep(0.002)
    samples.append((time.monotonic() - purged) * 1000)
samples.sort()
pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]
print(f"{len(samples)} purges: B stopped serving the purged page after "
      f"p50 {pick(0.5):.0f} ms, p90 {pick(0.9):.0f} ms, p99 {pick(0.99):.0f} ms, "
      f"max {samples[-1]:.0f} ms")
PY
