#!/usr/bin/env bash
# Issue 5 experiment: the shared harness's gzip8k page (/gz/8k.html, 8,192 B HTML, 2,338 B gzip,
# Vary: Accept-Encoding, served by the harness's nginx origin with gzip_static) behind Varnish,
# nginx proxy_cache and Lacquer, in the same run:
#   1. hits for gzip clients (Accept-Encoding: gzip) and identity clients (no Accept-Encoding),
#      interleaved rounds, wrk pinned to CPU 0 and each target to CPU 1: req/s and target CPU
#      seconds, so req per CPU-second;
#   2. memory per cached object: OBJECTS distinct copies of the page (/v/o<i>/gz/8k.html, which the
#      origin rewrites to the page) are requested once by a gzip client and once by an identity
#      client; the target's growth in RSS (plus its tmpfs cache files for nginx) divided by
#      OBJECTS, and each target's own count (Lacquer /stats, varnishstat, nginx cache files).
# Varnish (http_gzip_support, its default) and Lacquer store one gzip copy and gunzip for identity
# clients; nginx proxy_cache stores one copy per Accept-Encoding value (Vary).
# Everything on 127.0.0.1:29500-29540; runtime files in /tmp/bench-gzip.
# Usage: bench/gzip_clients.sh [seconds per run, default 8] [rounds, default 3]
# env: OBJECTS (default 2000), CONNS (64), HARNESS (../shared/bench), TARGETS (varnish nginx lacquer)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SECS=${1:-8}; ROUNDS=${2:-3}; OBJECTS=${OBJECTS:-2000}; CONNS=${CONNS:-64}
HARNESS=${HARNESS:-$(cd ../shared/bench && pwd)}
TARGETS=${TARGETS:-varnish nginx lacquer}
for tool in wrk varnishd varnishstat nginx curl python3 taskset; do
  command -v $tool >/dev/null || { echo "needs $tool (see $HARNESS/README.md for the apt-get line)" >&2; exit 1; }
done
cargo build --release --bin lacquer -q
BIN=$(pwd)/target/release/lacquer
R=/tmp/bench-gzip
rm -rf "$R"; mkdir -p "$R"/{origin,varnish,nginx,lacquer,shm}
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
declare -A PORT=([varnish]=29510 [nginx]=29520 [lacquer]=29530)
declare -A PID

python3 "$HARNESS/origin/gen_content.py" "$R/docroot" 10 >/dev/null
LISTEN_PORT=29500 SLOW_PORT=29501 RUN_DIR=$R/origin DOCROOT=$R/docroot WORKERS=2 \
  bash "$HARNESS/origin/nginx.sh" & PIDS+=($!)
wait_port 29500
for t in varnish nginx; do
  LISTEN_PORT=${PORT[$t]} ORIGIN_PORT=29500 RUN_DIR=$R/$t SHM_DIR=$R/shm CACHE_MB=512 WORKERS=2 \
    bash "$HARNESS/proxies/$t.sh" & PID[$t]=$!; PIDS+=($!)
done
cat > "$R/lacquer/lacquer.toml" <<CFG
listen = ["127.0.0.1:${PORT[lacquer]}"]
upstream = "127.0.0.1:29500"
threads = 2
[cache]
memory_size = "512MiB"
[log]
access = "off"
[admin]
listen = "127.0.0.1:29540"
CFG
"$BIN" --config "$R/lacquer/lacquer.toml" & PID[lacquer]=$!; PIDS+=($!)
for t in $TARGETS; do wait_port ${PORT[$t]}; done
wait_port 29540

tree() { # the PID and all its descendants
  local p=$1; echo "$p"; for c in $(cat /proc/$p/task/*/children 2>/dev/null); do tree "$c"; done; }
cpu_ticks() { local s=0; for p in $(tree "$1"); do
  s=$((s + $(awk '{print $14 + $15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $s; }
rss_kb() { local s=0; for p in $(tree "$1"); do
  s=$((s + $(awk '/^VmRSS:/ {print $2}' /proc/$p/status 2>/dev/null || echo 0))); done; echo $s; }
pin() { for p in $(tree "$1"); do for t in /proc/$p/task/*; do taskset -pc "$2" "${t##*/}" >/dev/null 2>&1 || true; done; done; }
TCK=$(getconf CLK_TCK)
ae_args() { # wrk header arguments for a client kind
  if [ "$1" = gzip ]; then H=(-H "Accept-Encoding: gzip"); else H=(); fi; }

# correctness first: both clients get the page byte-exact (gzip decoded), and the identity
# client never gets Content-Encoding
PLAIN=$R/docroot/gz/8k.html
for t in $TARGETS; do
  url=http://127.0.0.1:${PORT[$t]}/gz/8k.html
  curl -s -H 'Accept-Encoding: gzip' "$url" -o "$R/$t.gz"; curl -s -H 'Accept-Encoding: gzip' "$url" -o "$R/$t.gz"
  gunzip -c "$R/$t.gz" | cmp -s - "$PLAIN" || { echo "$t: gzip client body differs" >&2; exit 1; }
  curl -s -D "$R/$t.id.h" "$url" -o "$R/$t.id"
  cmp -s "$R/$t.id" "$PLAIN" || { echo "$t: identity client body differs" >&2; exit 1; }
  ! grep -qi '^content-encoding' "$R/$t.id.h" || { echo "$t: identity client got Content-Encoding" >&2; exit 1; }
done
echo "verified: gzip and identity clients get the page byte-exact from $TARGETS" >&2

OUT=$R/results.md
{
  echo "## gzip8k page, gzip and identity clients ($(date -u +%F' '%H:%M) UTC, ${SECS}s x $ROUNDS rounds, -c $CONNS, pinned)"
  echo
  echo "| target | client | round | req/s | target CPU s | req/CPU-s |"
  echo "|---|---|---|---|---|---|"
} > "$OUT"
for t in $TARGETS; do pin "${PID[$t]}" 1; done
url_for() { echo "http://127.0.0.1:${PORT[$1]}/gz/8k.html"; }
for t in $TARGETS; do # warm-up
  for client in gzip identity; do
    ae_args $client
    taskset -c 0 wrk -t1 -c"$CONNS" -d2s "${H[@]}" "$(url_for $t)" >/dev/null
  done
done
for round in $(seq "$ROUNDS"); do
  for t in $TARGETS; do
    for client in gzip identity; do
      ae_args $client
      before=$(cpu_ticks "${PID[$t]}")
      out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${SECS}s" "${H[@]}" "$(url_for $t)")
      after=$(cpu_ticks "${PID[$t]}")
      rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
      reqs=$(awk '/requests in/ {print $1}' <<<"$out")
      cpu=$(awk -v a="$after" -v b="$before" -v k="$TCK" 'BEGIN {printf "%.2f", (a - b) / k}')
      per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN {printf "%.0f", (c > 0 ? r / c : 0)}')
      echo "| $t | $client | $round | $rps | $cpu | $per |" >> "$OUT"
      if grep -q "Non-2xx\|Socket errors" <<<"$out"; then
        echo "$t/$client round $round: $(grep 'Non-2xx\|Socket errors' <<<"$out")" >&2
      fi
    done
  done
done

# memory per cached object
fill() { # $1 = port: every object once with gzip, once without Accept-Encoding, on keep-alive
  python3 - "$1" "$OBJECTS" <<'PY'
import http.client, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
for i in range(n):
    for headers in ({"Accept-Encoding": "gzip"}, {}):
        c.request("GET", "/v/o%d/gz/8k.html" % i, headers=headers)
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
PY
}
{
  echo
  echo "## memory per cached object: $OBJECTS copies of the page, each fetched by a gzip and an identity client"
  echo
  echo "| target | RSS growth KiB | + tmpfs cache KiB | per object B | target's own count |"
  echo "|---|---|---|---|---|"
} >> "$OUT"
for t in $TARGETS; do
  rss0=$(rss_kb "${PID[$t]}")
  shm0=$(du -sk "$R/shm/cache" 2>/dev/null | cut -f1 || echo 0)
  fill "${PORT[$t]}"
  sleep 1
  rss1=$(rss_kb "${PID[$t]}")
  shm1=$(du -sk "$R/shm/cache" 2>/dev/null | cut -f1 || echo 0)
  [ "$t" = nginx ] || { shm0=0; shm1=0; }
  case $t in
    lacquer) own=$(curl -s http://127.0.0.1:29540/stats | python3 -c 'import json,sys; m=json.load(sys.stdin)["memory"]; print("%d objects, %d bytes, %.0f B/object" % (m["objects"], m["bytes"], m["bytes"]/max(m["objects"],1)))') ;;
    varnish) own=$(varnishstat -n "$R/varnish/work" -1 -f MAIN.n_object -f SMA.s0.g_bytes | awk '{printf "%s=%s ", $1, $2}') ;;
    nginx) own="$(find "$R/shm/cache" -type f | wc -l) cache files" ;;
  esac
  per=$(( ( (rss1 - rss0) + (shm1 - shm0) ) * 1024 / OBJECTS ))
  echo "| $t | $((rss1 - rss0)) | $((shm1 - shm0)) | $per | $own |" >> "$OUT"
done
cat "$OUT"
echo "results: $OUT" >&2
