#!/usr/bin/env bash
# Issue 18 item 7 at an equal offered load: what a hit read from memcached costs Lacquer's CPU
# against a hit from its memory tier, with every variant asked the same requests per second.
#
# bench/shared_tier_latency.sh runs the shared harness, whose wrk sends as fast as each target
# answers. On a two-core machine the memcached variants share CPU 0 with wrk, Toxiproxy and
# memcached, so each variant runs at another load, and a proxy's CPU per request depends on its
# load (fewer requests per wake-up, per epoll turn, per memcached batch at a lower one): every
# Toxiproxy round there was flagged noisy. Here h2load (`--h1`, 64 connections) sends a fixed
# rate that every variant can keep up with, so the variants differ only in where the hit is read
# from. Per round and variant: Lacquer's user and system time from /proc over the run, divided by
# the requests answered (hits per CPU-second), and the latency of each request from h2load's log
# (p50, p99), the CPU split into user and system microseconds per hit, and the context switches
# of Lacquer's threads per hit (/proc/PID/task/*/status). Variants, each a
# Lacquer of its own with its workers (2 unless THREADS says) pinned to CPU 1:
#   memory       memory tier only (the reference)
#   mc           memcached on loopback, local_ttl = 0s (every hit read from memcached)
#   mc-tp        the same through Toxiproxy with no toxic (what the relay itself adds)
#   mc-100us     through Toxiproxy, 0.1 ms each way
#   mc-500us     through Toxiproxy, 0.5 ms each way
# Scenarios: hot1k (one 1 KB page) and ws10k (10,000 pages of 1 KB asked in turn).
#
#   LACQUER_BIN=target/pgo/lacquer bench/tier_fixed_rate.sh            # 16,000 requests/s, 5 rounds
#   RATE=8000 ROUNDS=3 SECONDS_PER_RUN=6 bench/tier_fixed_rate.sh
#   VARIANTS=memory,mc-100us SCENARIOS=hot1k bench/tier_fixed_rate.sh
#   THREADS=1 bench/tier_fixed_rate.sh                                  # one worker thread
#   BINS="base=/tmp/a,new=/tmp/b" VARIANTS=memory,mc-100us bench/tier_fixed_rate.sh
#       two builds side by side, rounds interleaved: each variant once per build (`mc-100us@new`),
#       each build's ratios taken to its own memory variant
#
# Output: a table per scenario (medians over rounds, and each variant's ratio to `memory` taken
# per round, median and range) on stdout and in $OUT (default /tmp/tier-fixed-rate.md).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RATE=${RATE:-16000}
ROUNDS=${ROUNDS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
THREADS=${THREADS:-2} # Lacquer's worker threads, all on CPU 1
CONNECTIONS=64
VARIANTS=${VARIANTS:-memory,mc,mc-tp,mc-100us,mc-500us}
SCENARIOS=${SCENARIOS:-hot1k,ws10k}
OUT=${OUT:-/tmp/tier-fixed-rate.md}
command -v h2load >/dev/null || apt-get install -y -q nghttp2-client >/dev/null
command -v memcached >/dev/null || apt-get install -y -q memcached >/dev/null
declare -A BIN_OF # label -> binary
if [ -n "${BINS:-}" ]; then
  expanded=()
  for pair in ${BINS//,/ }; do
    BIN_OF[${pair%%=*}]=$(realpath "${pair#*=}")
    for v in ${VARIANTS//,/ }; do expanded+=("$v@${pair%%=*}"); done
  done
  VARIANTS=$(IFS=,; echo "${expanded[*]}")
  LACQUER_BIN="$BINS"
else
  if [ -z "${LACQUER_BIN:-}" ]; then
    cargo build --release --bin lacquer -q
    LACQUER_BIN=$(pwd)/target/release/lacquer
  fi
  LACQUER_BIN=$(realpath "$LACQUER_BIN")
fi
RUN=$(mktemp -d /tmp/tier-fixed-rate-XXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$RUN"' EXIT

ON_CPU=(taskset -c 0) # the daemons share the client's CPU; Lacquer has CPU 1
start_toxiproxy "$RUN"

ORIGIN=$(free_port)
LISTEN_PORT=$ORIGIN RUN_DIR=$RUN/origin WORKERS=1 taskset -c 0 bench/pass_origin.sh \
  >"$RUN/origin.log" 2>&1 & PIDS+=($!)
wait_port "$ORIGIN" 10

declare -A LISTEN
for v in ${VARIANTS//,/ }; do
  config=$RUN/$v.toml
  printf '[log]\naccess = "off"\n[cache]\nmemory_size = "512MiB"\n' >"$config"
  bin=$LACQUER_BIN
  [ -n "${BINS:-}" ] && bin=${BIN_OF[${v#*@}]}
  case ${v%@*} in
    memory) ;;
    mc) memcached_for ;;
    mc-tp) relayed "$v" none ;;
    mc-100us) relayed "$v" 100 ;;
    mc-500us) relayed "$v" 500 ;;
    *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
  if [ "${v%@*}" != memory ]; then
    # op_timeout: a healthy server here (the default 100 ms could eject one on a busy host)
    printf '[cache.memcached]\nservers = ["127.0.0.1:%s"]\nlocal_ttl = "0s"\nop_timeout = "1s"\n' \
      "$PORT" >>"$config"
  fi
  LISTEN[$v]=$(free_port)
  taskset -c 1 "$bin" --config "$config" --listen "127.0.0.1:${LISTEN[$v]}" \
    --upstream "127.0.0.1:$ORIGIN" --threads "$THREADS" >"$RUN/$v.log" 2>&1 & PIDS+=($!)
  echo "$!" >"$RUN/$v.pid"
  wait_port "${LISTEN[$v]}" 10
done

uris() { # SCENARIO PORT -> the URIs h2load asks, one per line
  case $1 in
    hot1k) echo "http://127.0.0.1:$2/cacheable/hot" ;;
    ws10k) for i in $(seq 1 10000); do echo "http://127.0.0.1:$2/cacheable/ws-$i"; done ;;
    *) echo "unknown scenario $1" >&2; exit 2 ;;
  esac
}
TICK=$(getconf CLK_TCK)
PER_CLIENT=$((RATE / CONNECTIONS))

echo "# Item 7 at a fixed rate: $((PER_CLIENT * CONNECTIONS)) requests/s, $CONNECTIONS connections, ${SECONDS_PER_RUN} s x $ROUNDS rounds" >"$OUT"
echo "binary: $LACQUER_BIN ($(date -u +%FT%TZ), $(nproc) CPUs, $THREADS worker threads)" >>"$OUT"
for scenario in ${SCENARIOS//,/ }; do
  for v in ${VARIANTS//,/ }; do
    uris "$scenario" "${LISTEN[$v]}" >"$RUN/$scenario-$v.uris"
    # warm: every page asked once (stored), then a short run at the rate
    pages=$(wc -l <"$RUN/$scenario-$v.uris")
    taskset -c 0 h2load --h1 -n "$pages" -c "$((pages < 8 ? pages : 8))" -i "$RUN/$scenario-$v.uris" >/dev/null
    taskset -c 0 h2load --h1 -c "$CONNECTIONS" --rps "$PER_CLIENT" -D 2 -i "$RUN/$scenario-$v.uris" >/dev/null
  done
  for round in $(seq 1 "$ROUNDS"); do
    for v in ${VARIANTS//,/ }; do
      pid=$(cat "$RUN/$v.pid")
      read -r user0 sys0 < <(user_system_ticks "$pid")
      switches0=$(context_switches "$pid")
      taskset -c 0 h2load --h1 -c "$CONNECTIONS" --rps "$PER_CLIENT" -D "$SECONDS_PER_RUN" \
        -i "$RUN/$scenario-$v.uris" --log-file "$RUN/latency.log" >"$RUN/h2load.out"
      read -r user1 sys1 < <(user_system_ticks "$pid")
      switches1=$(context_switches "$pid")
      done_=$(awk '/^requests:/ { print $6 }' "$RUN/h2load.out")
      ok=$(awk '/^status codes:/ { print $3 }' "$RUN/h2load.out")
      python3 - "$RUN/latency.log" "$scenario" "$v" "$round" "$((user1 - user0))" "$((sys1 - sys0))" "$TICK" "$done_" "$ok" "$((switches1 - switches0))" >>"$RUN/rows" <<'PY'
import sys
log, scenario, variant, rnd, user, system, tick, done, ok, switches = sys.argv[1:]
ticks = int(user) + int(system)
lat = sorted(int(l.split()[2]) for l in open(log) if l.strip())
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1000
cpu = int(ticks) / int(tick)
us = lambda t: int(t) / int(tick) / int(done) * 1e6
print(scenario, variant, rnd, done, ok, f"{cpu:.3f}", f"{int(done) / cpu:.0f}", f"{pct(0.5):.3f}", f"{pct(0.99):.3f}",
      f"{us(user):.2f}", f"{us(system):.2f}", f"{int(switches) / int(done):.2f}")
PY
    done
  done
done

python3 - "$RUN/rows" "$VARIANTS" >>"$OUT" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
variants = sys.argv[2].split(",")
med = st.median
for scenario in dict.fromkeys(r[0] for r in rows):
    print(f"\n## {scenario}\n")
    print("| variant | answered | 2xx | CPU s | hits per CPU-second | / memory, per round (range) | user us | sys us | switches | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    by = {v: [r for r in rows if r[0] == scenario and r[1] == v] for v in variants}
    for v in variants:
        rs = by[v]
        if not rs:
            continue
        # each build's variants against that build's memory tier
        reference = "memory" + (v[v.index("@"):] if "@" in v else "")
        ref = {r[2]: float(r[6]) for r in by.get(reference, [])}
        ratios = [float(r[6]) / ref[r[2]] for r in rs if r[2] in ref]
        ratio = f"{med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios and v != reference else ""
        print(f"| {v} | {med(int(r[3]) for r in rs):,.0f} | {med(int(r[4]) for r in rs):,.0f} | "
              f"{med(float(r[5]) for r in rs):.2f} | {med(float(r[6]) for r in rs):,.0f} | {ratio} | "
              f"{med(float(r[9]) for r in rs):.2f} | {med(float(r[10]) for r in rs):.2f} | "
              f"{med(float(r[11]) for r in rs):.2f} | "
              f"{med(float(r[7]) for r in rs):.2f} | {med(float(r[8]) for r in rs):.2f} |")
PY
cat "$OUT"
