#!/usr/bin/env bash
# Issue 17 item 14, the gzip_clients.sh experiment for every coding Lacquer stores: the harness's
# 8 KB HTML page, served identity by the harness's nginx origin (/plain8k.html, a copy of
# /gz/8k.html outside its gzip_static location), stored by Lacquer coded on store
# ([cache.compression] enabled, coding = gzip | br | zstd, default levels), in the same run:
#   1. hits for clients that take the stored coding (Accept-Encoding: <coding>) and for identity
#      clients (no Accept-Encoding: the copy is decoded whole on the fast path and the decoded
#      copy kept, so this is the steady state), and again for identity clients with
#      decoded_copies = "0" (every hit decodes: the decoder's own cost), interleaved rounds, wrk
#      pinned to CPU 0 and Lacquer to CPU 1: req/s and Lacquer's CPU seconds, so req per
#      CPU-second;
#   2. the stored copy's size, and memory per cached object: OBJECTS distinct copies of the page
#      (/v/o<i>/plain8k.html) requested once by a client taking the coding and once by an
#      identity client; RSS growth divided by OBJECTS, and Lacquer's own count (/stats).
# Everything on 127.0.0.1:29600-29640; runtime files in /tmp/bench-coded.
# Usage: bench/coded_clients.sh [seconds per run, default 8] [rounds, default 3]
# env: OBJECTS (default 2000), CONNS (64), HARNESS (../shared/bench), CODINGS (gzip br zstd)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SECS=${1:-8}; ROUNDS=${2:-3}; OBJECTS=${OBJECTS:-2000}; CONNS=${CONNS:-64}
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
CODINGS=${CODINGS:-gzip br zstd}
for tool in wrk nginx curl python3 taskset; do
  command -v $tool >/dev/null || { echo "needs $tool (see $HARNESS/README.md for the apt-get line)" >&2; exit 1; }
done
cargo build --release --bin lacquer -q
BIN=$(pwd)/target/release/lacquer
R=/tmp/bench-coded
rm -rf "$R"; mkdir -p "$R"/{origin,lacquer}
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
PORT=29630; ADMIN=29640

python3 "$HARNESS/origin/gen_content.py" "$R/docroot" 10 >/dev/null
cp "$R/docroot/gz/8k.html" "$R/docroot/plain8k.html"
PLAIN=$R/docroot/plain8k.html
LISTEN_PORT=29600 SLOW_PORT=29601 RUN_DIR=$R/origin DOCROOT=$R/docroot WORKERS=2 \
  bash "$HARNESS/origin/nginx.sh" & PIDS+=($!)
wait_port 29600

tree() { # the PID and all its descendants
  local p=$1; echo "$p"; for c in $(cat /proc/$p/task/*/children 2>/dev/null); do tree "$c"; done; }
cpu_ticks() { local s=0; for p in $(tree "$1"); do
  s=$((s + $(awk '{print $14 + $15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $s; }
rss_kb() { awk '/^VmRSS:/ {print $2}' /proc/$1/status; }
pin() { for t in /proc/$1/task/*; do taskset -pc "$2" "${t##*/}" >/dev/null 2>&1 || true; done; }
TCK=$(getconf CLK_TCK)
URL=http://127.0.0.1:$PORT/plain8k.html

start_lacquer() { # $1 = coding, $2 = decoded_copies
  cat > "$R/lacquer/$1.toml" <<CFG
listen = ["127.0.0.1:$PORT"]
upstream = "127.0.0.1:29600"
threads = 2
[cache]
memory_size = "512MiB"
[cache.compression]
enabled = true
coding = "$1"
decoded_copies = "$2"
[log]
access = "off"
[admin]
listen = "127.0.0.1:$ADMIN"
CFG
  "$BIN" --config "$R/lacquer/$1.toml" & LQ=$!; PIDS+=($LQ)
  wait_port $PORT; wait_port $ADMIN
}
stop_lacquer() { kill "$LQ"; wait "$LQ" 2>/dev/null || true; }
decode() { # $1 = coding, stdin coded, stdout plain (no brotli tool here: a br copy is checked
  # through the identity client, whom Lacquer serves it decoded)
  case $1 in
    gzip) gunzip -c ;;
    zstd) zstd -dc ;;
  esac
}
measure() { # $1 = coding, $2 = stored bytes, $3 = label, $4 = round, then wrk header arguments
  local coding=$1 stored=$2 label=$3 round=$4; shift 4
  local before after out rps reqs cpu per
  before=$(cpu_ticks "$LQ")
  out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${SECS}s" "$@" "$URL")
  after=$(cpu_ticks "$LQ")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  cpu=$(awk -v a="$after" -v b="$before" -v k="$TCK" 'BEGIN {printf "%.2f", (a - b) / k}')
  per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN {printf "%.0f", (c > 0 ? r / c : 0)}')
  echo "| $coding | $stored | $label | $round | $rps | $cpu | $per |" >> "$OUT"
  if grep -q "Non-2xx\|Socket errors" <<<"$out"; then
    echo "$coding/$label round $round: $(grep 'Non-2xx\|Socket errors' <<<"$out")" >&2
  fi
}

OUT=$R/results.md
{
  echo "## 8 KB page coded on store, clients taking the coding and identity clients ($(date -u +%F' '%H:%M) UTC, ${SECS}s x $ROUNDS rounds, -c $CONNS, pinned)"
  echo
  echo "| stored coding | stored bytes | client | round | req/s | Lacquer CPU s | req/CPU-s |"
  echo "|---|---|---|---|---|---|---|"
} > "$OUT"
MEM=$R/memory.md
{
  echo
  echo "## memory per cached object: $OBJECTS copies of the page, each fetched by a client taking the coding and by an identity client"
  echo
  echo "| stored coding | RSS growth KiB | per object B | Lacquer's own count |"
  echo "|---|---|---|---|"
} > "$MEM"
for coding in $CODINGS; do
  start_lacquer "$coding" 16MiB
  # correctness first: the coded copy decodes to the page, the identity client gets the page
  curl -s -H "Accept-Encoding: $coding" "$URL" -o /dev/null
  curl -s -D "$R/$coding.h" -H "Accept-Encoding: $coding" "$URL" -o "$R/$coding.body"
  grep -qi "^content-encoding: $coding" "$R/$coding.h" || { echo "$coding: not stored coded" >&2; exit 1; }
  if [ "$coding" != br ]; then
    decode "$coding" < "$R/$coding.body" | cmp -s - "$PLAIN" || { echo "$coding: body differs" >&2; exit 1; }
  fi
  curl -s -D "$R/$coding.id.h" "$URL" -o "$R/$coding.id"
  cmp -s "$R/$coding.id" "$PLAIN" || { echo "$coding: identity client body differs" >&2; exit 1; }
  ! grep -qi '^content-encoding' "$R/$coding.id.h" || { echo "$coding: identity client got Content-Encoding" >&2; exit 1; }
  stored=$(stat -c %s "$R/$coding.body")
  pin "$LQ" 1
  taskset -c 0 wrk -t1 -c"$CONNS" -d2s -H "Accept-Encoding: $coding" "$URL" >/dev/null # warm-up
  taskset -c 0 wrk -t1 -c"$CONNS" -d2s "$URL" >/dev/null
  for round in $(seq "$ROUNDS"); do
    measure "$coding" "$stored" "takes $coding" "$round" -H "Accept-Encoding: $coding"
    measure "$coding" "$stored" "identity" "$round"
  done
  rss0=$(rss_kb "$LQ")
  python3 - "$PORT" "$OBJECTS" "$coding" <<'PY'
import http.client, sys
port, n, coding = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = http.client.HTTPConnection("127.0.0.1", port)
for i in range(n):
    for headers in ({"Accept-Encoding": coding}, {}):
        c.request("GET", "/v/o%d/plain8k.html" % i, headers=headers)
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
PY
  sleep 1
  rss1=$(rss_kb "$LQ")
  own=$(curl -s http://127.0.0.1:$ADMIN/stats | python3 -c 'import json,sys; m=json.load(sys.stdin)["memory"]; print("%d objects, %d bytes, %.0f B/object" % (m["objects"], m["bytes"], m["bytes"]/max(m["objects"],1)))')
  echo "| $coding | $((rss1 - rss0)) | $(( (rss1 - rss0) * 1024 / OBJECTS )) | $own |" >> "$MEM"
  stop_lacquer
  # every identity hit decodes: no decoded copies kept
  start_lacquer "$coding" 0
  curl -s -H "Accept-Encoding: $coding" "$URL" -o /dev/null
  cmp -s <(curl -s "$URL") "$PLAIN" || { echo "$coding: identity client body differs" >&2; exit 1; }
  pin "$LQ" 1
  taskset -c 0 wrk -t1 -c"$CONNS" -d2s "$URL" >/dev/null # warm-up
  for round in $(seq "$ROUNDS"); do
    measure "$coding" "$stored" "identity, decoded_copies 0" "$round"
  done
  stop_lacquer
done
cat "$MEM" >> "$OUT"
cat "$OUT"
echo "results: $OUT" >&2
