#!/usr/bin/env bash
# Soak: steady mixed load through two Lacquer nodes over three memcached servers (each behind a
# Toxiproxy proxy), while the servers are killed, frozen and restarted, slowed and cut, the origin
# is killed and restarted, and hostile clients send garbage and slow headers. Every body is checked
# against the digest in its URL (bench/soak/soak.go). Prints a per-phase table (requests, errors by
# cause, wrong bodies, p50/p99/max), panics in the nodes' logs, and their RSS at start and end;
# exits non-zero on a wrong body, an error outside the origin-down phase, or a panic.
# Loopback only, bounded: about 4.5 minutes at the default phase length.
#
#   bench/soak.sh [phase seconds, default 20] [requests per second, default 300]
#
# Needs: memcached, Go (the load generator and Toxiproxy are built here), curl.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
PHASE=${1:-20}
RATE=${2:-300}
OP_TIMEOUT_MS=100
RUN=$(mktemp -d /tmp/lacquer-soak.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do
    kill -CONT "$p" 2>/dev/null || true
    kill "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
now_ms() { date +%s%3N; }
phase() { echo "$(now_ms) $*" >> "$RUN/phases.log"; echo "soak: $(date +%T) phase $*"; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

command -v memcached >/dev/null && command -v go >/dev/null && command -v curl >/dev/null || {
  echo "soak: needs memcached, go and curl" >&2; exit 1; }

# ---- build ----
if [ -z "${LACQUER_BIN:-}" ]; then
  cargo build --release --bin lacquer -q
  LACQUER_BIN=target/release/lacquer
fi
(cd bench/soak && go build -o "$RUN/soak" soak.go)
TOXIPROXY="$(go env GOPATH)/bin/server"
[ -x "$TOXIPROXY" ] || go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0

# ---- memcached x3 behind Toxiproxy ----
TP=$(free_port)
"$TOXIPROXY" -host 127.0.0.1 -port "$TP" >"$RUN/toxiproxy.log" 2>&1 & PIDS+=($!)
wait_port "$TP"
toxi() { curl -sf -X "$1" "http://127.0.0.1:$TP$2" ${3:+-d "$3"} >/dev/null; }
MC_PORT=(); MC_PID=(); PROXY_PORT=()
start_memcached() { # $1 = index
  memcached -p "${MC_PORT[$1]}" -l 127.0.0.1 -U 0 -m 64 -u root >/dev/null 2>&1 &
  MC_PID[$1]=$!; PIDS+=($!)
  wait_port "${MC_PORT[$1]}"
}
for i in 0 1 2; do
  MC_PORT[$i]=$(free_port); PROXY_PORT[$i]=$(free_port)
  start_memcached "$i"
  toxi POST /proxies "{\"name\":\"mc$i\",\"listen\":\"127.0.0.1:${PROXY_PORT[$i]}\",\"upstream\":\"127.0.0.1:${MC_PORT[$i]}\",\"enabled\":true}"
done

# ---- origin ----
ORIGIN_PORT=$(free_port)
start_origin() {
  "$RUN/soak" origin -listen "127.0.0.1:$ORIGIN_PORT" >"$RUN/origin.log" 2>&1 &
  ORIGIN_PID=$!; PIDS+=($!)
  wait_port "$ORIGIN_PORT"
}
start_origin

# ---- two nodes ----
NODE_PORT=(); NODE_PID=(); ADMIN_PORT=()
for n in 0 1; do
  NODE_PORT[$n]=$(free_port); ADMIN_PORT[$n]=$(free_port)
  cat > "$RUN/node$n.toml" <<TOML
listen = ["127.0.0.1:${NODE_PORT[$n]}"]
upstream = "127.0.0.1:$ORIGIN_PORT"
threads = 2
[log]
access = "off"
level = "warn"
[admin]
listen = "127.0.0.1:${ADMIN_PORT[$n]}"
[cache]
memory_size = "16MiB"                    # full during warmup: RSS is then steady
[cache.memcached]
servers = ["127.0.0.1:${PROXY_PORT[0]}", "127.0.0.1:${PROXY_PORT[1]}", "127.0.0.1:${PROXY_PORT[2]}"]
op_timeout = "${OP_TIMEOUT_MS}ms"
connect_timeout = "50ms"
failure_limit = 3
retry_after = "2s"
local_ttl = "2s"
fill_lease = "3s"
[balancer.timeouts]
connect = "1s"
first_byte = "5s"
idle = "5s"
total = "8s"
TOML
  "$LACQUER_BIN" --config "$RUN/node$n.toml" >"$RUN/node$n.log" 2>&1 & NODE_PID[$n]=$!; PIDS+=($!)
  wait_port "${NODE_PORT[$n]}"
done
NODES="127.0.0.1:${NODE_PORT[0]},127.0.0.1:${NODE_PORT[1]}"

# ---- load, with faults ----
PHASES=14 # warmup included
"$RUN/soak" load -nodes "$NODES" -rate "$RATE" -duration "$(( PHASE * PHASES + 10 ))s" -log "$RUN/requests.log" &
LOAD_PID=$!; PIDS+=($!)
phase warmup
sleep "$PHASE"
RSS_START=("$(rss_kb "${NODE_PID[0]}")" "$(rss_kb "${NODE_PID[1]}")")
phase baseline; sleep "$PHASE"

phase memcached-killed;      kill -9 "${MC_PID[1]}"; sleep "$PHASE"
start_memcached 1; phase memcached-restarted; sleep "$PHASE"

phase memcached-frozen;      kill -STOP "${MC_PID[2]}"; sleep "$PHASE"
phase memcached-thawed;      kill -CONT "${MC_PID[2]}"; sleep "$PHASE"

phase latency-50ms
toxi POST /proxies/mc0/toxics '{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":50,"jitter":10}}'
sleep "$PHASE"; toxi DELETE /proxies/mc0/toxics/slow

phase latency-300ms
toxi POST /proxies/mc0/toxics '{"name":"slower","type":"latency","stream":"downstream","attributes":{"latency":300}}'
sleep "$PHASE"; toxi DELETE /proxies/mc0/toxics/slower

phase blackholed
toxi POST /proxies/mc1/toxics '{"name":"hole","type":"timeout","stream":"upstream","attributes":{"timeout":0}}'
sleep "$PHASE"; toxi DELETE /proxies/mc1/toxics/hole

phase cut;                   toxi POST /proxies/mc2 '{"enabled":false}'; sleep "$PHASE"
phase reconnected;           toxi POST /proxies/mc2 '{"enabled":true}'; sleep "$PHASE"

# origin-down: until the restarted origin accepts again (its errors are the allowed ones)
phase origin-killed origin-down
kill -9 "$ORIGIN_PID"; sleep "$PHASE"
start_origin; phase origin-restarted; sleep "$PHASE"

phase hostile-clients
"$RUN/soak" hostile -nodes "$NODES" -duration "${PHASE}s" > "$RUN/hostile.log" &
HOSTILE_PID=$!; PIDS+=($!)
wait "$HOSTILE_PID" || true
phase end
wait "$LOAD_PID" || true
sleep 1
RSS_END=("$(rss_kb "${NODE_PID[0]}")" "$(rss_kb "${NODE_PID[1]}")")

# ---- report ----
status=0
"$RUN/soak" report -log "$RUN/requests.log" -phases "$RUN/phases.log" | tee "$RUN/report.md" || status=1
panics=$(cat "$RUN/node0.log" "$RUN/node1.log" | grep -c "panicked" || true)
echo "panics in the nodes' logs: $panics"
[ "$panics" -eq 0 ] || status=1
cat "$RUN/hostile.log"
for n in 0 1; do
  echo "node$n RSS: start $(( RSS_START[n] / 1024 )) MiB, end $(( RSS_END[n] / 1024 )) MiB"
  kill -0 "${NODE_PID[$n]}" 2>/dev/null || { echo "node$n died" >&2; status=1; }
done
for n in 0 1; do
  echo "node$n /stats: $(curl -sf "http://127.0.0.1:${ADMIN_PORT[$n]}/stats" || echo unavailable)"
done
echo "op_timeout: ${OP_TIMEOUT_MS} ms; rate: $RATE req/s; phase: ${PHASE}s; files in $RUN"
exit "$status"
