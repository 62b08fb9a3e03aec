#!/usr/bin/env bash
# User-space instructions per request on the hit path, counted by callgrind: deterministic to a
# fraction of a percent, so it shows a 2 % change that wall-clock runs (5-15 % spread per round)
# cannot. It complements bench/run.sh, it does not replace it: the kernel's share (about half of
# a hit's CPU time) and cache misses are not in it, and callgrind counts `rep movsb` per byte, so
# copies weigh more here than on the CPU.
#
#   bench/hit_instructions.sh                          # this tree's release build, 1 KB demo page
#   bench/hit_instructions.sh --bin /tmp/lacquer-old   # another build, for an A/B
#   ORIGIN=127.0.0.1:28080 bench/hit_instructions.sh --path /gz/8k.html --header 'Accept-Encoding: gzip'
#   bench/hit_instructions.sh --path /tagged/1         # a page with three tags (Surrogate-Key)
#   bench/hit_instructions.sh --memcached              # every hit read from memcached (local_ttl 0s)
#   URLS=100 bench/hit_instructions.sh --memcached --path '/page/{i}'   # ... over 100 pages in turn
#   bench/hit_instructions.sh --memcached --bans 1000  # ... judged against 1,000 tag bans
#   bench/hit_instructions.sh --rules 100              # with 100 request rules (bench/rules_config.py)
#   ORIGIN=... bench/hit_instructions.sh --config br.toml --path /plain8k.html   # more config
#   bench/hit_instructions.sh --h2 10                  # hits over h2c, 10 streams at once (h2load)
#   bench/hit_instructions.sh --memcached --h1-clients 32   # HTTP/1.1 hits from 32 connections at
#                                                      # once (h2load --h1): memcached gets batched
#   bench/hit_instructions.sh --cache-sim              # also simulated I1 misses and mispredicted branches
#   bench/hit_instructions.sh --annotate               # also the 40 costliest functions (inclusive)
#   DUMP_TO=/tmp/h2.callgrind bench/hit_instructions.sh --h2 10   # keep the dump for callgrind_annotate
#
# Lacquer runs under valgrind with one worker thread; after a warm-up of 2,000 hits the counters
# are zeroed, N hits (default 20,000) are sent over one keep-alive connection, and the total is
# divided by N. Without ORIGIN, the demo origin is started (its /page/ pages are 1 KB, max-age 30;
# /tagged/ pages carry three tags). With --memcached a memcached is started and Lacquer keeps no
# local copy, so each hit is a verified memcached read judged by the ban list; --bans N first
# issues N tag bans (of other tags) through the admin API, so the ban list is not empty. The
# invalidation log is read every 10 s here (not 250 ms), so its background reads stay out of the
# per-hit figure. An older build, which knows no `[invalidation]` or admin token, needs --plain
# (no admin listener or invalidation keys in its config).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=$(pwd)/target/release/lacquer
REQUESTS=20000
REQ_PATH=/page/1
HEADERS=()
MEMCACHED=0
BANS=0
PLAIN=0
RULES=0
EXTRA_CONFIG=
H2_STREAMS=0
H1_CLIENTS=0
ANNOTATE=0
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --cache-sim) SIM=(--cache-sim=yes --branch-sim=yes); shift ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --path) REQ_PATH=$2; shift 2 ;;
    --header) HEADERS+=("$2"); shift 2 ;;
    --memcached) MEMCACHED=1; shift ;;
    --bans) BANS=$2; shift 2 ;;
    --plain) PLAIN=1; shift ;;
    --rules) RULES=$2; shift 2 ;;
    --config) EXTRA_CONFIG=$(realpath "$2"); shift 2 ;;
    --h2) H2_STREAMS=$2; shift 2 ;;
    --h1-clients) H1_CLIENTS=$2; shift 2 ;;
    --annotate) ANNOTATE=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || apt-get install -y -q valgrind >/dev/null
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer --bin demo-origin -q

WORK=$(mktemp -d /tmp/hit-instructions.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

if [ -z "${ORIGIN:-}" ]; then
  ORIGIN=127.0.0.1:$(free_port)
  target/release/demo-origin --listen "$ORIGIN" --render-ms 0 >/dev/null 2>&1 &
  PIDS+=($!)
fi
PORT=$(free_port)
ADMIN=$(free_port)
TOKEN=bench-token-0123456789abcdef
: >"$WORK/lacquer.toml"
if [ "$PLAIN" = 0 ]; then
  printf '%s\n' "$TOKEN" >"$WORK/token"
  {
    printf '[admin]\nlisten = "127.0.0.1:%s"\ntoken_file = "%s"\n' "$ADMIN" "$WORK/token"
    printf '[invalidation]\npoll_interval = "10s"\n'
  } >>"$WORK/lacquer.toml"
fi
if [ "$MEMCACHED" = 1 ]; then
  MC_PORT=$(free_port)
  memcached -p "$MC_PORT" -l 127.0.0.1 -U 0 -m 64 -u root &
  PIDS+=($!)
  printf '[cache.memcached]\nservers = ["127.0.0.1:%s"]\nlocal_ttl = "0s"\n' "$MC_PORT" >>"$WORK/lacquer.toml"
fi
if [ "$H2_STREAMS" -gt 0 ] || [ "$H1_CLIENTS" -gt 0 ]; then
  # (h2c prior knowledge is on by default on plain listeners)
  command -v h2load >/dev/null || apt-get install -y -q nghttp2-client >/dev/null
fi
if [ "$RULES" -gt 0 ]; then
  python3 bench/rules_config.py "$RULES" >>"$WORK/lacquer.toml"
fi
# --config FILE: its sections are added to the script's (so they must not repeat [admin],
# [invalidation] or [cache.memcached])
[ -n "$EXTRA_CONFIG" ] && cat "$EXTRA_CONFIG" >>"$WORK/lacquer.toml"
CONFIG=(--config "$WORK/lacquer.toml")
valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" "${SIM[@]}" \
  "$BIN" "${CONFIG[@]}" --listen 127.0.0.1:"$PORT" --upstream "$ORIGIN" --threads 1 \
  --memory-size 512MiB --access-log off >"$WORK/lacquer.log" 2>&1 &
VALGRIND=$!
PIDS+=($VALGRIND)

cat >"$WORK/client.py" <<'PY'
import http.client, os, sys
port, n, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
urls = int(os.environ.get("URLS", "1"))
headers = dict(h.split(": ", 1) for h in sys.argv[4:])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(n):
    conn.request("GET", path.replace("{i}", str(i % urls)), headers=headers)
    resp = conn.getresponse()
    resp.read()
    if resp.status not in (200, 206):  # 206: a `--header "Range: ..."`
        sys.exit(f"status {resp.status}")
status = resp.getheader("cache-status") or ""
if "hit" not in status:
    sys.exit(f"not a hit: {status}")
PY
for _ in $(seq 1 100); do
  python3 "$WORK/client.py" "$PORT" 1 "$REQ_PATH" "${HEADERS[@]}" 2>/dev/null && break || sleep 0.3
done
if [ "$BANS" -gt 0 ]; then
  python3 - "$ADMIN" "$TOKEN" "$BANS" <<'PY'
import http.client, json, sys
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
for i in range(int(sys.argv[3])):
    conn.request("POST", "/ban", json.dumps({"tag": f"other-tag-{i}", "wait": False}),
                 {"Authorization": "Bearer " + sys.argv[2], "Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    if resp.status not in (200, 202):
        sys.exit(f"ban refused: {resp.status}")
PY
fi
# the measured hits: HTTP/1.1 keep-alive from client.py, or h2c (prior knowledge) from h2load
hits() {
  if [ "$H2_STREAMS" -gt 0 ]; then
    local h=() out
    for x in "${HEADERS[@]}"; do h+=(-H "$x"); done
    out=$(h2load -n "$1" -c 1 -m "$H2_STREAMS" "${h[@]}" "http://127.0.0.1:$PORT$REQ_PATH")
    grep -q "$1 succeeded" <<<"$out" || { echo "h2load: not every request succeeded: $out" >&2; exit 1; }
  elif [ "$H1_CLIENTS" -gt 0 ]; then
    local h=() out
    for x in "${HEADERS[@]}"; do h+=(-H "$x"); done
    out=$(h2load --h1 -n "$1" -c "$H1_CLIENTS" "${h[@]}" "http://127.0.0.1:$PORT$REQ_PATH")
    grep -q "$1 succeeded" <<<"$out" || { echo "h2load: not every request succeeded: $out" >&2; exit 1; }
  else
    python3 "$WORK/client.py" "$PORT" "$1" "$REQ_PATH" "${HEADERS[@]}"
  fi
}
hits 2000
callgrind_control -z "$VALGRIND" >/dev/null 2>&1
hits "$REQUESTS"
callgrind_control -d "$VALGRIND" >/dev/null 2>&1
DUMP=$(ls -t "$WORK"/callgrind.out.* | head -1)
TOTAL=$(callgrind_annotate "$DUMP" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
[ -n "${DUMP_TO:-}" ] && cp "$DUMP" "$DUMP_TO"
PROTOCOL=HTTP/1.1
[ "$H2_STREAMS" -gt 0 ] && PROTOCOL="h2c, $H2_STREAMS streams"
[ "$H1_CLIENTS" -gt 0 ] && PROTOCOL="HTTP/1.1, $H1_CLIENTS connections"
echo "$(basename "$BIN") $REQ_PATH ($PROTOCOL): $((TOTAL / REQUESTS)) user-space instructions per hit ($REQUESTS hits)"
cache_sim_report "$DUMP" "$REQUESTS"
if [ "$ANNOTATE" = 1 ]; then
  callgrind_annotate --inclusive=yes "$DUMP" 2>/dev/null | sed -n '/^Ir/,$p' | head -44
fi
