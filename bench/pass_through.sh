#!/usr/bin/env bash
# Uncacheable pass-through requests, Lacquer beside nginx and HAProxy, measured the shared
# harness's way (../shared/bench): its proxy start scripts, its daemon life cycle
# (lib/common.sh) and its measurement driver (lib/bench.py: wrk pinned to CPU 0 and each target
# to CPU 1, interleaved rounds, requests per target CPU-second, noise control, the same report),
# with two scenarios the harness does not have:
#
#   pass_nostore  GET of one URL whose origin answer is `Cache-Control: no-store`: looked up,
#                 forwarded, never stored (each proxy must not serve it from a cache)
#   pass_post     POST with a 100-byte form body: forwarded, never looked up
#
# The origin is bench/pass_origin.sh (nginx answering at once from memory, 1 KB), `direct` is
# that origin without a proxy.
#
#   bench/pass_through.sh                                   # 5 rounds x 4 s, this tree's build
#   bench/pass_through.sh --rounds 3 --proxies direct,nginx,lacquer
#   bench/pass_through.sh --proxy 'lacquer-base=/tmp/lacquer-base --listen 127.0.0.1:$LISTEN_PORT ...'
#
# Results: /tmp/pass-run/results/<run-id>/report.md (and results.csv, raw/).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
find_harness
[ -d "${HARNESS:-}" ] || { echo "the shared harness is not found: set HARNESS" >&2; exit 2; }
ROUNDS=5
DURATION=4
WARMUP=2
WORKERS=2
CACHE_MB=512
TARGET_LIST=direct,nginx,haproxy,lacquer
SCENARIOS=pass_nostore,pass_post
declare -A ADHOC=()
ADHOC_NAMES=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --proxies) TARGET_LIST=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --proxy) ADHOC[${2%%=*}]=${2#*=}; ADHOC_NAMES+=("${2%%=*}"); shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
LACQUER_DEFAULT=0
case ",$TARGET_LIST," in *,lacquer,*) [ -z "${ADHOC[lacquer]:-}" ] && LACQUER_DEFAULT=1 ;; esac
if [ "$LACQUER_DEFAULT" = 1 ]; then
  cargo build --release --bin lacquer -q
  # the command line bench/run.sh gives the harness
  ADHOC[lacquer]="$(pwd)/target/release/lacquer --listen 127.0.0.1:\$LISTEN_PORT --upstream 127.0.0.1:\$ORIGIN_PORT --threads \$WORKERS --memory-size \${CACHE_MB}MiB --access-log off"
fi
IFS=, read -r -a TARGETS <<<"$TARGET_LIST"
for n in "${ADHOC_NAMES[@]}"; do
  case ",$TARGET_LIST," in *,"$n",*) ;; *) TARGETS+=("$n") ;; esac
done

export BENCH_RUN=/tmp/pass-run BENCH_SHM=/dev/shm/pass-run
# shellcheck source=/dev/null
source "$HARNESS/lib/common.sh"
RUN_ID=$(date +%Y%m%d-%H%M%S)
OUT=$RUN/results/$RUN_ID
mkdir -p "$RUN/pids" "$RUN/logs" "$SHM" "$OUT"
for f in "$RUN"/pids/*.pid; do
  [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && die "daemon from an earlier run still alive ($f)"
done
trap 'stop_all' EXIT
trap 'exit 130' INT TERM

ORIGIN_PORT=$(free_port)
LISTEN_PORT=$ORIGIN_PORT RUN_DIR=$RUN/origin WORKERS=$WORKERS start_daemon origin "$(pwd)/bench/pass_origin.sh" >/dev/null
wait_port "$ORIGIN_PORT" 20 "$(cat "$RUN/pids/origin.pid")" || die "origin did not start: $(tail -5 "$RUN/logs/origin.log")"

TARGET_ARGS=()
for n in "${TARGETS[@]}"; do
  if [ "$n" = direct ]; then
    TARGET_ARGS+=(--target "direct=$ORIGIN_PORT=$(cat "$RUN/pids/origin.pid")")
    continue
  fi
  if [ -n "${ADHOC[$n]:-}" ]; then
    script=$RUN/proxies/$n.sh
    mkdir -p "$RUN/proxies"
    printf '#!/usr/bin/env bash\nexec %s\n' "${ADHOC[$n]}" >"$script"
  elif [ -f "$HARNESS/proxies/$n.sh" ]; then
    script=$HARNESS/proxies/$n.sh
  else
    die "no proxy named $n (neither --proxy $n=CMD nor $HARNESS/proxies/$n.sh)"
  fi
  port=$(free_port)
  rm -rf "${RUN:?}/proxies/$n" "${SHM:?}/$n"
  mkdir -p "$RUN/proxies/$n" "$SHM/$n"
  NAME=$n LISTEN_PORT=$port ORIGIN_HOST=127.0.0.1 ORIGIN_PORT=$ORIGIN_PORT RUN_DIR=$RUN/proxies/$n \
    SHM_DIR=$SHM/$n CACHE_MB=$CACHE_MB WORKERS=$WORKERS start_daemon "$n" "$script" >/dev/null
  wait_port "$port" 60 "$(cat "$RUN/pids/$n.pid")" || die "$n did not start: $(tail -5 "$RUN/logs/$n.log")"
  TARGET_ARGS+=(--target "$n=$port=$(cat "$RUN/pids/$n.pid")")
done
sleep 0.5

# every proxy must pass these requests on: the origin sees each one
python3 - "$ORIGIN_PORT" "${TARGET_ARGS[@]}" <<'PY'
import http.client, sys, urllib.request
origin = int(sys.argv[1])
def origin_count():
    return int(urllib.request.urlopen(f"http://127.0.0.1:{origin}/__status").read().decode().splitlines()[2].split()[2])
for arg in sys.argv[2:]:
    if arg == "--target" or arg.startswith("direct="):
        continue
    name, port, _ = arg.split("=", 2)
    before = origin_count()
    for method in ("GET", "GET", "POST", "POST"):
        c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
        path = "/nostore/1k" if method == "GET" else "/post/form"
        c.request(method, path, body=b"q=1" if method == "POST" else None)
        r = c.getresponse()
        if r.status != 200 or len(r.read()) != 1024:
            sys.exit(f"{name}: {method} {path}: status {r.status}")
    seen = origin_count() - before - 1
    if seen != 4:
        sys.exit(f"{name}: the origin saw {seen} of 4 pass-through requests")
    print(f"verified {name}: 4 of 4 requests passed through", file=sys.stderr)
PY

python3 - "$HARNESS/lib" "$OUT" "$RUN" "$ORIGIN_PORT" "$(cat "$RUN/pids/origin.pid")" "$ROUNDS" "$DURATION" \
  "$WARMUP" "$SCENARIOS" "$RUN_ID" "${TARGET_ARGS[@]}" <<'PY'
import os, sys
lib, out, run, origin_port, origin_pid, rounds, duration, warmup, scenarios, run_id = sys.argv[1:11]
targets = sys.argv[11:]
sys.path.insert(0, lib)
import bench  # the shared harness's driver, unchanged: only its scenario list is extended

body = "q=" + "a" * 98
bench.SCENARIOS["pass_nostore"] = dict(
    path="/nostore/1k", desc="pass: GET of one URL the origin answers with Cache-Control: no-store, 1 KB")
bench.SCENARIOS["pass_post"] = dict(
    script="post", path="/post/form", desc="pass: POST with a 100-byte form body, 1 KB answer")
plain_lua = bench.lua_script

def lua_script(kind, args, tag):
    path = plain_lua(None if kind == "post" else kind, args, tag)
    if kind == "post":
        with open(path) as f:
            report = f.read()
        with open(path, "w") as f:
            f.write('wrk.method = "POST"\nwrk.body = "%s"\n'
                    'wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"\n' % body + report)
    return path

bench.lua_script = lua_script
csv = os.path.join(out, "results.csv")
for sc in scenarios.split(","):
    sys.argv = ["bench.py", "measure", "--scenario", sc, "--origin-port", origin_port, "--origin-pids", origin_pid,
                "--rounds", rounds, "--duration", duration, "--warmup", warmup, "--pin", "--quiet-wait", "15",
                "--noise-budget", "30", "--run-id", run_id, "--run-dir", run, "--out-dir", out, "--csv", csv]
    sys.argv += targets
    bench.main()
sys.argv = ["bench.py", "report", "--csv", csv, "--md", os.path.join(out, "report.md")]
bench.main()
PY
ln -sfn "$OUT" "$RUN/results/latest"
echo "report: $OUT/report.md" >&2
