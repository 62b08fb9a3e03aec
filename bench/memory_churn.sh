#!/usr/bin/env bash
# RSS against cache.memory_size while large objects churn through the memory tier: a release
# lacquer with a small memory tier is sent distinct large objects worth several times its size
# (every one a miss that is stored, most later evicted), and its RSS is read during and after.
# Loopback only; about a minute per configuration.
#
#   bench/memory_churn.sh                             # 256MiB tier, 4x its size written
#   bench/memory_churn.sh --memory 128MiB --times 8
#   bench/memory_churn.sh --bin /tmp/lacquer-old --env MIMALLOC_PURGE_DELAY=0
#   bench/memory_churn.sh --cache 'max_object_size = "2MiB"'   # a line added to [cache]
#
# The origin is an nginx serving three incompressible files (64 KiB, 256 KiB and 1 MiB) under
# distinct URLs (/big/<size>/<n>), `Cache-Control: public, max-age=3600`; the objects cycle
# through the three sizes (mean 448 KiB). wrk (16 connections, 1 thread) asks for each URL once,
# in order. RSS (VmRSS) is read at rest, every second while the objects stream in (its peak),
# right after, and 5 s later; the tier's own bytes and objects come from the admin /stats.
# The figures: RSS over memory_size (the whole process), and the growth of RSS over the bytes
# the tier says it holds (what the cache itself costs beyond its accounting), and Lacquer's CPU
# time (user + system) per object stored while they streamed in.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=$(pwd)/target/release/lacquer
MEMORY=256MiB
TIMES=4
ENVS=()
CACHE_LINES=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --memory) MEMORY=$2; shift 2 ;;
    --times) TIMES=$2; shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --cache) CACHE_LINES+=("$2"); shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer -q

WORK=$(mktemp -d /tmp/memory-churn.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; rm -rf "$WORK"; }
trap cleanup EXIT
mib() { python3 -c "
import re,sys
m=re.fullmatch(r'(\d+)\s*(KiB|MiB|GiB)?', sys.argv[1]); n=int(m[1]); u=m[2] or ''
print(n * {'':1,'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}[u] // (1<<20))" "$1"; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' /proc/"$1"/status; }
cpu_ticks() { awk '{ print $14 + $15 }' /proc/"$1"/stat; }   # utime + stime, clock ticks

chmod 755 "$WORK"   # nginx's workers (www-data) read the files
mkdir -p "$WORK/www" "$WORK/origin/tmp"
head -c $((64 << 10)) /dev/urandom >"$WORK/www/64k.bin"
head -c $((256 << 10)) /dev/urandom >"$WORK/www/256k.bin"
head -c $((1 << 20)) /dev/urandom >"$WORK/www/1m.bin"
ORIGIN_PORT=$(free_port)
cat >"$WORK/origin/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $WORK/origin/nginx.pid;
error_log $WORK/origin/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/origin/tmp/body;
    proxy_temp_path $WORK/origin/tmp/proxy;
    fastcgi_temp_path $WORK/origin/tmp/fastcgi;
    uwsgi_temp_path $WORK/origin/tmp/uwsgi;
    scgi_temp_path $WORK/origin/tmp/scgi;
    sendfile on;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$ORIGIN_PORT backlog=4096;
        root $WORK/www;
        default_type application/octet-stream;
        location /big/ {
            add_header Cache-Control "public, max-age=3600";
            rewrite ^/big/([^/]+)/ /\$1.bin break;
        }
    }
}
CONF
nginx -c "$WORK/origin/nginx.conf" -p "$WORK/origin" -e "$WORK/origin/error.log" &
PIDS+=($!)
wait_port "$ORIGIN_PORT" 20

PORT=$(free_port)
ADMIN=$(free_port)
cat >"$WORK/lacquer.toml" <<EOF
listen = ["127.0.0.1:$PORT"]
upstream = "127.0.0.1:$ORIGIN_PORT"
threads = 2
[cache]
memory_size = "$MEMORY"
max_object_size = "2MiB"
$([ ${#CACHE_LINES[@]} -gt 0 ] && printf '%s\n' "${CACHE_LINES[@]}")
[log]
access = "off"
[admin]
listen = "127.0.0.1:$ADMIN"
EOF
env "${ENVS[@]}" "$BIN" --config "$WORK/lacquer.toml" >"$WORK/lacquer.log" 2>&1 &
LQ=$!
PIDS+=($LQ)
wait_port "$PORT" 20
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/big/64k/0")
[ "$code" = 200 ] || { echo "the origin answered $code" >&2; exit 1; }
stat() { curl -s "http://127.0.0.1:$ADMIN/stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['memory']['$1'])"; }

MEM_MB=$(mib "$MEMORY")
# objects of 64 KiB, 256 KiB and 1 MiB in turn: 1,344 KiB per three
OBJECTS=$((TIMES * MEM_MB * 1024 * 3 / 1344))
cat >"$WORK/churn.lua" <<'LUA'
local sizes = { "64k", "256k", "1m" }
local counter = 0
function init(args) total = tonumber(args[1]) end
function request()
   counter = counter + 1
   if counter > total then counter = 1 end
   return wrk.format(nil, "/big/" .. sizes[counter % 3 + 1] .. "/" .. counter)
end
LUA
sleep 1
REST=$(rss_kb "$LQ")
CPU0=$(cpu_ticks "$LQ")
# each URL once: at the rate measured, stop wrk when the tier has seen every object (by the
# count of misses the origin could not have served twice: the tier's evictions plus objects)
wrk -t 1 -c 16 -d 3600s -s "$WORK/churn.lua" "http://127.0.0.1:$PORT" -- "$OBJECTS" \
  >"$WORK/wrk.txt" 2>&1 &
WRK=$!
PIDS+=($WRK)
PEAK=$REST
while :; do
  now=$(rss_kb "$LQ"); [ "$now" -gt "$PEAK" ] && PEAK=$now
  seen=$(($(stat objects) + $(stat evictions)))
  [ "$seen" -ge "$OBJECTS" ] && break
  kill -0 "$WRK" 2>/dev/null || { cat "$WORK/wrk.txt" >&2; exit 1; }
  sleep 1
done
kill "$WRK"; wait "$WRK" 2>/dev/null || true
CPU1=$(cpu_ticks "$LQ")
sleep 1
AFTER=$(rss_kb "$LQ")
sleep 5
LATER=$(rss_kb "$LQ")
BYTES=$(stat bytes)
HELD=$(stat objects)
EVICTED=$(stat evictions)
LIMIT=$(stat limit)
python3 - "$REST" "$PEAK" "$AFTER" "$LATER" "$BYTES" "$HELD" "$EVICTED" "$LIMIT" "$OBJECTS" \
  "$((CPU1 - CPU0))" "$(getconf CLK_TCK)" "${ENVS[*]:-}" <<'PY'
import sys
rest, peak, after, later, held_bytes, held, evicted, limit, objects, ticks, hz = map(int, sys.argv[1:12])
env = sys.argv[12]
mb = lambda kb: kb / 1024
print(f"memory_size {limit >> 20} MiB, {objects} objects written (mean 448 KiB){', ' + env if env else ''}")
print(f"  tier holds {held} objects, {held_bytes / 2**20:.0f} MiB ({held_bytes / limit:.2f} of the limit); {evicted} evicted")
print(f"  RSS at rest {mb(rest):.0f} MB, peak {mb(peak):.0f} MB, after {mb(after):.0f} MB, +5 s {mb(later):.0f} MB")
print(f"  RSS / memory_size: peak {peak * 1024 / limit:.2f}, after {after * 1024 / limit:.2f}, +5 s {later * 1024 / limit:.2f}")
print(f"  RSS growth / bytes held: peak {(peak - rest) * 1024 / held_bytes:.2f}, +5 s {(later - rest) * 1024 / held_bytes:.2f}")
print(f"  Lacquer CPU while they streamed in: {ticks / hz:.2f} s, {ticks / hz * 1e6 / (held + evicted):.0f} us per object stored")
PY
