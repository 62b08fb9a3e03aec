#!/usr/bin/env bash
# User-space instructions per miss or pass, counted by callgrind (the hit path's counterpart is
# bench/hit_instructions.sh; read its header for what such a count includes and leaves out: the
# kernel's share and cache misses are not in it).
#
#   bench/miss_instructions.sh                        # cacheable miss: every request a new URL
#   bench/miss_instructions.sh --memcached            # ... with a memcached tier (read, fill lease, write)
#   bench/miss_instructions.sh --kind nostore         # pass: the origin answers Cache-Control: no-store
#   bench/miss_instructions.sh --kind post            # pass: a POST (100-byte form body)
#   bench/miss_instructions.sh --kind nostore --same-url   # one no-store URL over and over
#   bench/miss_instructions.sh --kind custom          # pass: no-store, and an `X-Request-Id` field:
#                                                     # a name not written as received without a
#                                                     # case map, so the answer's head gets one
#   bench/miss_instructions.sh --bin /tmp/lacquer-base      # another build, for an A/B
#   bench/miss_instructions.sh --annotate 40          # also the 40 costliest functions (inclusive)
#   bench/miss_instructions.sh --keep /tmp/miss.out   # keep the callgrind dump (callgrind_annotate)
#   bench/miss_instructions.sh --browser-fields       # each request also carries the ten fields
#                                                     # a browser sends (User-Agent, Accept, Cookie...)
#   bench/miss_instructions.sh --cache-sim           # also simulated I1 misses and mispredicted
#                                                     # branches per request (code layout: PGO, BOLT)
#   bench/miss_instructions.sh --config off.toml      # more config (e.g. [cache] enabled = false:
#                                                     # the same request proxied with no cache work)
#
# The origin is bench/pass_origin.sh (nginx answering a 1 KB page at once from memory, on a real
# socket); Lacquer runs under valgrind with one worker thread. After a warm-up of 500 requests
# (which also fills the upstream connection pool) the counters are zeroed, N requests (default
# 3,000) are sent over one keep-alive connection, each to a URL never asked before (unless
# --same-url), and the total is divided by N. With --memcached a memcached is started and is the
# shared tier (default local_ttl): each miss looks there, claims the cluster's fill lease and
# writes the fill to memcached as well as to memory. The invalidation log is read every 10 s (not
# 250 ms), so its background reads stay out of the per-request figure.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=$(pwd)/target/release/lacquer
REQUESTS=3000
KIND=miss
SAME_URL=0
BROWSER_FIELDS=0
MEMCACHED=0
ANNOTATE=0
KEEP=
EXTRA_CONFIG=
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --cache-sim) SIM=(--cache-sim=yes --branch-sim=yes); shift ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --kind) KIND=$2; shift 2 ;;
    --same-url) SAME_URL=1; shift ;;
    --browser-fields) BROWSER_FIELDS=1; shift ;;
    --memcached) MEMCACHED=1; shift ;;
    --annotate) ANNOTATE=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --config) EXTRA_CONFIG=$(realpath "$2"); shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case $KIND in miss | nostore | custom | post) ;; *) echo "--kind: miss, nostore, custom or post" >&2; exit 2 ;; esac
command -v valgrind >/dev/null || apt-get install -y -q valgrind >/dev/null
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer -q

WORK=$(mktemp -d /tmp/miss-instructions.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

ORIGIN_PORT=$(free_port)
LISTEN_PORT=$ORIGIN_PORT RUN_DIR=$WORK/origin WORKERS=1 bench/pass_origin.sh >"$WORK/origin.log" 2>&1 &
PIDS+=($!)
PORT=$(free_port)
printf '[invalidation]\npoll_interval = "10s"\n' >"$WORK/lacquer.toml"
if [ "$MEMCACHED" = 1 ]; then
  MC_PORT=$(free_port)
  memcached -p "$MC_PORT" -l 127.0.0.1 -U 0 -m 64 -u root &
  PIDS+=($!)
  printf '[cache.memcached]\nservers = ["127.0.0.1:%s"]\n' "$MC_PORT" >>"$WORK/lacquer.toml"
fi
# --config FILE: its sections are added to the script's (so they must not repeat [invalidation]
# or [cache.memcached])
[ -n "$EXTRA_CONFIG" ] && cat "$EXTRA_CONFIG" >>"$WORK/lacquer.toml"
valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" "${SIM[@]}" \
  "$BIN" --config "$WORK/lacquer.toml" --listen 127.0.0.1:"$PORT" --upstream 127.0.0.1:"$ORIGIN_PORT" \
  --threads 1 --memory-size 512MiB --access-log off >"$WORK/lacquer.log" 2>&1 &
VALGRIND=$!
PIDS+=($VALGRIND)

cat >"$WORK/client.py" <<'PY'
import http.client, sys
port, n, kind, same, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
browser = {
    "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "Accept-Language": "en-US,en;q=0.9",
    "Cookie": "_ga=GA1.2.12345; sessionid=abcdef",
    "Upgrade-Insecure-Requests": "1",
    "Sec-Fetch-Dest": "document",
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Site": "none",
    "Sec-Fetch-User": "?1",
    "Priority": "u=0, i",
} if sys.argv[6] == "1" else {}
prefix = {"miss": "/cacheable/", "nostore": "/nostore/", "custom": "/custom/", "post": "/post/"}[kind]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(n):
    path = prefix + ("same" if same else f"{tag}-{i}")
    if kind == "post":
        conn.request("POST", path, body=b"q=" + b"a" * 98,
                     headers={"Content-Type": "application/x-www-form-urlencoded", **browser})
    else:
        conn.request("GET", path, headers=browser)
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200 or len(body) != 1024:
        sys.exit(f"status {resp.status}, {len(body)} bytes")
status = resp.getheader("cache-status") or ""
if "hit" in status:
    sys.exit(f"a hit: {status}")
PY
for _ in $(seq 1 100); do
  python3 "$WORK/client.py" "$PORT" 1 "$KIND" "$SAME_URL" probe "$BROWSER_FIELDS" 2>/dev/null && break || sleep 0.3
done
python3 "$WORK/client.py" "$PORT" 500 "$KIND" "$SAME_URL" warm "$BROWSER_FIELDS"
callgrind_control -z "$VALGRIND" >/dev/null 2>&1
python3 "$WORK/client.py" "$PORT" "$REQUESTS" "$KIND" "$SAME_URL" measured "$BROWSER_FIELDS"
callgrind_control -d "$VALGRIND" >/dev/null 2>&1
DUMP=$(ls -t "$WORK"/callgrind.out.* | head -1)
TOTAL=$(callgrind_annotate "$DUMP" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
MODE=memory
[ "$MEMCACHED" = 1 ] && MODE=memcached
URLS=distinct
[ "$SAME_URL" = 1 ] && URLS=same
echo "$(basename "$BIN") $KIND ($MODE, $URLS URLs): $((TOTAL / REQUESTS)) user-space instructions per request ($REQUESTS requests)"
cache_sim_report "$DUMP" "$REQUESTS"
[ -n "$KEEP" ] && cp "$DUMP" "$KEEP"
if [ "$ANNOTATE" -gt 0 ]; then
  # inclusive cost per request of the costliest functions (a function's callees included)
  callgrind_annotate --inclusive=yes "$DUMP" 2>/dev/null |
    sed -nE 's/^ *([0-9,]+) +\( *[0-9.]+%\)  (.*)$/\1 \2/p' | head -n "$((ANNOTATE + 1))" | tail -n "$ANNOTATE" |
    awk -v n="$REQUESTS" '{ c = $1; gsub(",", "", c); $1 = ""; printf "%9d %s\n", c / n, $0 }'
fi
