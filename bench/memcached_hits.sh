#!/usr/bin/env bash
# Issue 3 benchmark (a): hits served from memcached versus hits served from the memory tier,
# same harness, same run. `lacquer` is the memory tier; `lacquer-mc` uses one local memcached with
# `local_ttl = "0s"`, so no hit is served from memory: every request reads, verifies and decodes
# the entry from memcached. Extra arguments go to the harness (e.g. --rounds 3).
# Results: /tmp/bench-run/results/<run-id>/report.md
set -euo pipefail
cd "$(dirname "$0")/.."
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
PORT=${MC_PORT:-21211}
cargo build --release --bin lacquer
BIN=$(pwd)/target/release/lacquer
CONF=$(mktemp /tmp/lacquer-mc-XXXX.toml)
cat > "$CONF" <<TOML
[log]
access = "off"
[cache]
memory_size = "512MiB"
[cache.memcached]
servers = ["127.0.0.1:$PORT"]
local_ttl = "0s"
TOML
memcached -u nobody -l 127.0.0.1 -p "$PORT" -U 0 -m 256 -t 1 &
MC=$!
trap 'kill $MC 2>/dev/null; rm -f "$CONF"' EXIT
sleep 0.5
COMMON="--listen 127.0.0.1:\$LISTEN_PORT --upstream 127.0.0.1:\$ORIGIN_PORT --threads \$WORKERS"
"$HARNESS/run.sh" \
  --proxy "lacquer=$BIN $COMMON --memory-size \${CACHE_MB}MiB --access-log off" \
  --proxy "lacquer-mc=$BIN --config $CONF $COMMON" \
  --proxies "lacquer,lacquer-mc" \
  --scenarios "${SCENARIOS:-hot1k,ws10k}" \
  "$@"
