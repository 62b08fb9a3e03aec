#!/usr/bin/env bash
# Memcached client choice for the hit path (issue 3): Lacquer's client against async-memcached 0.9,
# each alone and with Lacquer's get batching, on one runtime thread with 64 concurrent getters.
# Three rounds; prints the median gets/s of each (memcached's own CPU is shared with the client).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${MC_PORT:-21411}
ROUNDS=${ROUNDS:-3}
cargo build --release -p lacquer-memcached --example mc_client
memcached -u nobody -l 127.0.0.1 -p "$PORT" -U 0 -t 1 &
MC=$!
trap 'kill $MC 2>/dev/null' EXIT
sleep 0.5
for _ in $(seq "$ROUNDS"); do
  target/release/examples/mc_client "127.0.0.1:$PORT" 64 3
done | python3 -c '
import sys, statistics, collections
runs = collections.defaultdict(list)
for line in sys.stdin:
    keys, client, per_sec, _ = [f.strip() for f in line.split("|")]
    runs[(keys, client)].append(float(per_sec))
print("| keys | client | gets/s (median) | runs |")
print("|---|---|---:|---|")
for (keys, client), v in runs.items():
    each = " / ".join(format(x, ",.0f") for x in v)
    print(f"| {keys} | {client} | {statistics.median(v):,.0f} | {each} |")
'
