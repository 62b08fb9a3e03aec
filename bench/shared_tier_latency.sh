#!/usr/bin/env bash
# Issue 18 item 7: the shared tier over a network with latency. Loopback has none, so each
# Lacquer variant reads its own memcached through Toxiproxy (bench/toxiproxy: the 2.12.0 server
# plus a microsecond `latency_us` toxic), with the same delay added each way:
#   lacquer          memory tier only (the reference: a hit from memory)
#   lacquer-mc       memcached straight on loopback, local_ttl = 0s (every hit read from memcached)
#   lacquer-mc-tp    the same through Toxiproxy with no toxic (what the relay itself costs)
#   lacquer-mc-100us through Toxiproxy, 0.1 ms each way
#   lacquer-mc-500us through Toxiproxy, 0.5 ms each way
# hot1k and ws10k are hits (from memcached for the -mc variants); miss50ms is what a node with no
# shared tier pays instead (every request to a 50 ms origin). VARIANTS=a,b runs only those
# variants. BASE_BIN=/path/to/an/older/lacquer defines base, base-mc and base-mc-100us: the same
# for that build, each on memcached servers of its own, so an A/B shares one run's rounds.
# Extra arguments go to the harness (e.g. --rounds 3).
# Results: /tmp/bench-run/results/<run-id>/report.md
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
RUN=$(mktemp -d /tmp/lacquer-tier-latency-XXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$RUN"' EXIT

if [ -z "${LACQUER_BIN:-}" ]; then
  cargo build --release --bin lacquer -q
  LACQUER_BIN=$(pwd)/target/release/lacquer
fi
start_toxiproxy "$RUN"

# one memcached per variant, so no variant reads what another stored (memcached_for, relayed:
# bench/lib.sh)
config_for() { # NAME SERVER_PORT: writes $RUN/NAME.toml
  cat > "$RUN/$1.toml" <<TOML
[log]
access = "off"
[cache]
memory_size = "512MiB"
[cache.memcached]
servers = ["127.0.0.1:$2"]
local_ttl = "0s"
# a healthy server here; the default 100ms would let a busy host (other builds on the two cores)
# eject it now and then, which is not what this measures
op_timeout = "${OP_TIMEOUT:-1s}"
TOML
}

memcached_for; config_for mc "$PORT"
relayed tp none; config_for tp "$PORT"
relayed tp100 100; config_for tp100 "$PORT"
relayed tp500 500; config_for tp500 "$PORT"
if [ -n "${BASE_BIN:-}" ]; then
  memcached_for; config_for base-mc "$PORT"
  relayed tp100-base 100; config_for base-tp100 "$PORT"
fi

COMMON="--listen 127.0.0.1:\$LISTEN_PORT --upstream 127.0.0.1:\$ORIGIN_PORT --threads \$WORKERS"
# VARIANTS picks some of them (the harness adds every --proxy it is given to the targets, so a
# --proxies argument cannot narrow the list)
declare -A VARIANT_CMD=(
  [lacquer]="$LACQUER_BIN $COMMON --memory-size \${CACHE_MB}MiB --access-log off"
  [lacquer-mc]="$LACQUER_BIN --config $RUN/mc.toml $COMMON"
  [lacquer-mc-tp]="$LACQUER_BIN --config $RUN/tp.toml $COMMON"
  [lacquer-mc-100us]="$LACQUER_BIN --config $RUN/tp100.toml $COMMON"
  [lacquer-mc-500us]="$LACQUER_BIN --config $RUN/tp500.toml $COMMON"
  [base]="${BASE_BIN:-} $COMMON --memory-size \${CACHE_MB}MiB --access-log off"
  [base-mc]="${BASE_BIN:-} --config $RUN/base-mc.toml $COMMON"
  [base-mc-100us]="${BASE_BIN:-} --config $RUN/base-tp100.toml $COMMON"
)
VARIANTS=${VARIANTS:-lacquer,lacquer-mc,lacquer-mc-tp,lacquer-mc-100us,lacquer-mc-500us}
PROXY_ARGS=()
for v in ${VARIANTS//,/ }; do
  [ -n "${VARIANT_CMD[$v]:-}" ] || { echo "unknown variant $v (${!VARIANT_CMD[*]})" >&2; exit 2; }
  PROXY_ARGS+=(--proxy "$v=${VARIANT_CMD[$v]}")
done
"$HARNESS/run.sh" \
  "${PROXY_ARGS[@]}" \
  --proxies "$VARIANTS" \
  --scenarios "${SCENARIOS:-hot1k,ws10k,miss50ms}" \
  "$@"
