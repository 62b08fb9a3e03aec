#!/usr/bin/env bash
# Runs Lacquer beside Varnish, nginx, Traffic Server and HAProxy under the shared harness
# (../shared/bench), same machine, same run, interleaved rounds. Extra arguments go to the harness,
# e.g.  bench/run.sh --scenarios hot1k --rounds 3   or   bench/run.sh --quick
# Results: /tmp/bench-run/results/latest/report.md (copy the tables into docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
if ! command -v varnishd >/dev/null || ! command -v wrk >/dev/null; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -q && apt-get install -y -q varnish nginx trafficserver haproxy wrk curl python3
fi
cargo build --release --bin lacquer
BIN=$(pwd)/target/release/lacquer
# the harness expands $LISTEN_PORT etc.; CACHE_MB and WORKERS match the other proxies' settings
CMD="$BIN --listen 127.0.0.1:\$LISTEN_PORT --upstream 127.0.0.1:\$ORIGIN_PORT --threads \$WORKERS --memory-size \${CACHE_MB}MiB --access-log off"
exec "$HARNESS/run.sh" \
  --proxy "lacquer=$CMD" \
  --proxies "${PROXIES:-direct,varnish,nginx,ats,haproxy,lacquer}" \
  --scenarios "${SCENARIOS:-hot1k,gzip8k,ws10k}" \
  "$@"
