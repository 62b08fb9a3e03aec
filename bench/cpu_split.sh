#!/usr/bin/env bash
# Where a request's CPU goes, Lacquer beside nginx: user-space and kernel microseconds per
# request and context switches, read from /proc for each proxy's processes over a wrk run. The
# shared harness says how many requests per CPU-second; this says whether the difference is in
# the proxy's own code (user) or in the system calls and wake-ups it asks of the kernel (sys).
#
#   bench/cpu_split.sh                              # nostore and miss, 3 rounds of 6 s, this tree's build
#   bench/cpu_split.sh --kinds nostore,miss,post --rounds 5
#   bench/cpu_split.sh --bin /tmp/lacquer-base      # another build
#   bench/cpu_split.sh --threads 1                  # both proxies with one worker
#
# Kinds (the origin is bench/pass_origin.sh, nginx answering at once from memory, 1 KB):
#   nostore  GET of one URL the origin answers `no-store`: a pass
#   post     POST with a 100-byte form body: a pass
#   miss     GET of a URL never asked before, stored
#   hit      GET of one stored 1 KB page
#
# Layout as the shared harness's: wrk -c64 -t1 and the origin pinned to CPU 0, the proxy to CPU
# 1 with 2 workers (`--threads`), 512 MB of cache; nginx with the harness's config
# (../shared/bench/proxies/nginx.sh: proxy_cache on tmpfs, upstream keep-alive). Rounds are
# interleaved (lacquer, nginx, lacquer, ...); medians are printed. Timings vary with the machine:
# compare the two proxies inside one run only.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
find_harness
[ -d "${HARNESS:-}" ] || { echo "the shared harness is not found: set HARNESS" >&2; exit 2; }
BIN=$(pwd)/target/release/lacquer
KINDS=nostore,miss
ROUNDS=3
SECONDS_PER_RUN=6
THREADS=2
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 2; }
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer -q

WORK=$(mktemp -d /tmp/cpu-split.XXXXXX)
# nginx's workers run as `nobody`: they must reach their cache directory inside
chmod 755 "$WORK"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

ORIGIN_PORT=$(free_port)
LISTEN_PORT=$ORIGIN_PORT RUN_DIR=$WORK/origin taskset -c 0 bench/pass_origin.sh >"$WORK/origin.log" 2>&1 &
PIDS+=($!)
wait_port "$ORIGIN_PORT"

cat >"$WORK/miss.lua" <<'LUA'
local n = 0
request = function() n = n + 1; return wrk.format("GET", "/cacheable/m" .. math.random(1e9) .. "-" .. n) end
LUA
cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = string.rep("a", 100)
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
LUA

# CPU ticks (user, system) and context switches (voluntary, involuntary) of PID and its
# descendants
snapshot() {
  local pids="$1 $(pgrep -d' ' -P "$1" || true)" u=0 s=0 v=0 n=0 p t
  for p in $pids $(for c in $(pgrep -P "$1" || true); do pgrep -P "$c" || true; done); do
    [ -r "/proc/$p/stat" ] || continue
    read -r -a f <"/proc/$p/stat"
    u=$((u + f[13])); s=$((s + f[14]))
    for t in /proc/"$p"/task/*/status; do
      v=$((v + $(awk '/^voluntary_ctxt/{print $2}' "$t")))
      n=$((n + $(awk '/^nonvoluntary_ctxt/{print $2}' "$t")))
    done
  done
  echo "$u $s $v $n"
}

# one run: TARGET KIND ROUND -> a line of results.tsv
run_one() {
  local target=$1 kind=$2 port pid url args=()
  port=$(free_port)
  mkdir -p "$WORK/$target"
  if [ "$target" = lacquer ]; then
    taskset -c 1 "$BIN" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$ORIGIN_PORT" \
      --threads "$THREADS" --memory-size 512MiB --access-log off >"$WORK/$target/log" 2>&1 &
  else
    LISTEN_PORT=$port ORIGIN_PORT=$ORIGIN_PORT RUN_DIR=$WORK/$target SHM_DIR=$WORK/$target/shm \
      CACHE_MB=512 WORKERS=$THREADS taskset -c 1 bash "$HARNESS/proxies/nginx.sh" >"$WORK/$target/log" 2>&1 &
  fi
  pid=$!
  wait_port "$port"
  case $kind in
    nostore) url=/nostore/one ;;
    hit) url=/cacheable/hot ;;
    miss) url=/; args=(-s "$WORK/miss.lua") ;;
    post) url=/post/one; args=(-s "$WORK/post.lua") ;;
  esac
  taskset -c 0 wrk -c64 -t1 -d2 "${args[@]}" "http://127.0.0.1:$port$url" >/dev/null
  local before after out requests
  before=$(snapshot "$pid")
  out=$(taskset -c 0 wrk -c64 -t1 -d"$SECONDS_PER_RUN" "${args[@]}" "http://127.0.0.1:$port$url")
  after=$(snapshot "$pid")
  pkill -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  requests=$(echo "$out" | awk '/requests in/{print $1}')
  if echo "$out" | grep -q "Non-2xx"; then
    echo "$target answered errors to $kind:" >&2; echo "$out" >&2; exit 1
  fi
  echo -e "$target\t$kind\t$requests\t$before\t$after" | tr ' ' '\t' >>"$WORK/results.tsv"
}

IFS=, read -r -a KIND_LIST <<<"$KINDS"
for kind in "${KIND_LIST[@]}"; do
  for round in $(seq "$ROUNDS"); do
    for target in lacquer nginx; do
      run_one "$target" "$kind"
      echo "  $kind round $round: $target done" >&2
    done
  done
done

python3 - "$WORK/results.tsv" "$(getconf CLK_TCK)" "$ROUNDS" "$SECONDS_PER_RUN" <<'PY'
import statistics, sys
path, tick, rounds, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {}
for line in open(path):
    t, k, req, u0, s0, v0, n0, u1, s1, v1, n1 = line.split()
    req = int(req)
    user = (int(u1) - int(u0)) / tick * 1e6 / req
    sys_ = (int(s1) - int(s0)) / tick * 1e6 / req
    ctx = (int(v1) - int(v0) + int(n1) - int(n0)) / req
    rows.setdefault((k, t), []).append((user, sys_, user + sys_, 1e6 / (user + sys_), ctx))
print(f"\nmedians of {rounds} rounds of {secs} s (us of CPU per request; ctx = context switches per request)\n")
print("| kind | target | user us | sys us | total us | req per CPU-s | ctx |")
print("|---|---|---:|---:|---:|---:|---:|")
for (k, t), v in rows.items():
    m = [statistics.median(col) for col in zip(*v)]
    print(f"| {k} | {t} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[3]:,.0f} | {m[4]:.2f} |")
PY
