#!/usr/bin/env bash
# Large hits run by run: how the kernel's cost of sending a cached 100 KB body varies from one
# wrk run (one set of client connections) to the next, for one or more Lacquer builds.
#
# The shared harness gives a median over a few rounds; on some machines Lacquer's large-hit
# rounds split into good and bad ones (docs/benchmarks.md, "Large hits on this machine"), and a
# median of five hides which. This runs many short runs per build, the builds alternating, and
# prints each run's Lacquer user and system time per hit (from /proc), hits per CPU-second,
# context switches per hit and its send system calls per hit (perf stat), then per build the
# median and range of the system time.
#
#   bench/large_hit_runs.sh                                            # this tree's release build
#   bench/large_hit_runs.sh --bin writev=/tmp/lacquer-a --bin sendfile=/tmp/lacquer-b --rounds 10
#   bench/large_hit_runs.sh --size 1048576 --threads 1
#
# Layout: wrk -c64 -t1 and an nginx origin (one worker, the body from a file, max-age 3600) on
# CPU 0, Lacquer on CPU 1. Each round starts every build afresh (a 2 s warm-up), runs it
# --runs-per-process times for --seconds, and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BINS=()
ROUNDS=4
RUNS=3
SECONDS_PER_RUN=4
SIZE=102400
THREADS=2
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BINS+=("$2"); shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --runs-per-process) RUNS=$2; shift 2 ;;
    --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
for tool in wrk nginx perf; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || {
    echo "large_hit_runs: needs $tool (apt-get install wrk nginx linux-perf)" >&2; exit 2; }
done
if [ ${#BINS[@]} -eq 0 ]; then
  cargo build --release --bin lacquer -q
  BINS=("lacquer=$(pwd)/target/release/lacquer")
fi

RUN=$(mktemp -d /tmp/large-hit-runs.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$RUN"' EXIT
mkdir -p "$RUN/www" "$RUN/tmp"
chmod 755 "$RUN" "$RUN/www" # nginx's workers read the body as their own user
head -c "$SIZE" /dev/urandom >"$RUN/www/body.bin"
chmod 644 "$RUN/www/body.bin"
ORIGIN=$(free_port)
cat >"$RUN/origin.conf" <<CONF
worker_processes 1; daemon off; pid $RUN/origin.pid; error_log $RUN/origin-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $RUN/tmp; proxy_temp_path $RUN/tmp; fastcgi_temp_path $RUN/tmp;
  uwsgi_temp_path $RUN/tmp; scgi_temp_path $RUN/tmp;
  server {
    listen 127.0.0.1:$ORIGIN;
    location / { root $RUN/www; add_header Cache-Control "public, max-age=3600"; }
  }
}
CONF
taskset -c 0 nginx -c "$RUN/origin.conf" -p "$RUN" & PIDS+=($!)
wait_port "$ORIGIN" 5

one_process() { # NAME BIN
  local name=$1 bin=$2 port pid i
  port=$(free_port)
  taskset -c 1 "$bin" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$ORIGIN" \
    --threads "$THREADS" --memory-size 512MiB --access-log off >"$RUN/lacquer.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_port "$port" 10
  curl -sf -o /dev/null "http://127.0.0.1:$port/body.bin"
  taskset -c 0 wrk -c64 -t1 -d2s "http://127.0.0.1:$port/body.bin" >/dev/null
  for i in $(seq 1 "$RUNS"); do
    read -r u0 s0 < <(user_system_ticks "$pid")
    c0=$(context_switches "$pid")
    perf stat -x, -p "$pid" -o "$RUN/perf.txt" \
      -e syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendfile64 \
      -- sleep "$SECONDS_PER_RUN.2" &
    local perf_pid=$!
    local out
    out=$(taskset -c 0 wrk -c64 -t1 -d"${SECONDS_PER_RUN}s" "http://127.0.0.1:$port/body.bin")
    wait "$perf_pid"
    read -r u1 s1 < <(user_system_ticks "$pid")
    c1=$(context_switches "$pid")
    local n
    n=$(echo "$out" | awk '/requests in/ { print $1 }')
    python3 - "$name" "$n" "$((u1 - u0))" "$((s1 - s0))" "$(getconf CLK_TCK)" "$((c1 - c0))" "$RUN/perf.txt" <<'PY' | tee -a "$RUN/rows"
import sys
name, n, user, system, tick, switches, perf = sys.argv[1:]
n, tick = int(n), int(tick)
calls = {}
for line in open(perf):
    parts = line.strip().split(",")
    if len(parts) > 2 and parts[2].startswith("syscalls:sys_enter_"):
        calls[parts[2][len("syscalls:sys_enter_"):]] = int(parts[0]) / n
us = lambda t: int(t) / tick / n * 1e6
cpu = (int(user) + int(system)) / tick
sends = " ".join(f"{k} {v:.2f}" for k, v in calls.items() if v >= 0.01)
print(f"{name}\t{n}\t{us(user):.1f}\t{us(system):.1f}\t{n / cpu:.0f}\t{int(switches) / n:.3f}\t{sends}")
PY
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

echo -e "build\thits\tuser us\tsystem us\thits per CPU-second\tswitches per hit\tsend calls per hit"
for round in $(seq 1 "$ROUNDS"); do
  for entry in "${BINS[@]}"; do
    one_process "${entry%%=*}" "${entry#*=}"
  done
done
echo
python3 - "$RUN/rows" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
for name in dict.fromkeys(r[0] for r in rows):
    system = sorted(float(r[3]) for r in rows if r[0] == name)
    rate = sorted(float(r[4]) for r in rows if r[0] == name)
    print(f"{name}: {len(system)} runs; system us per hit median {st.median(system):.1f} "
          f"(range {system[0]:.1f}-{system[-1]:.1f}); hits per CPU-second median "
          f"{st.median(rate):,.0f} (range {rate[0]:,.0f}-{rate[-1]:,.0f})")
PY
