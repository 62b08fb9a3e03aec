#!/usr/bin/env bash
# Memory per cached object: each target is filled with N small distinct objects (default
# 1,000,000) from a fast origin, and its memory growth is divided by the number of objects it
# reports holding. Loopback only; one target at a time; a few minutes per target at 1M.
#
#   bench/memory_per_object.sh                                  # lacquer, varnish, nginx; 1M objects
#   bench/memory_per_object.sh --objects 200000 --targets "lacquer varnish"
#   bench/memory_per_object.sh --bin /tmp/lacquer-old --targets lacquer
#
# The origin is an nginx answering every /o/<id> with a small distinct body (about 60 bytes,
# `Cache-Control: public, max-age=3600`), so the fill runs at the proxies' miss rate, not at a
# disk's. wrk (64 connections, 2 threads) asks for /o/<thread>-<1..N/2> in order and is stopped
# when the origin has served N requests; then a sample of 1,000 objects is asked again and must
# be hits. Each target gets 4 GiB of cache (nothing is evicted) and 2 workers:
#   lacquer  cache.memory_size 4GiB, estimated_objects N, access log off
#   varnish  -s malloc,4096m, builtin VCL (as /work/shared/bench/proxies/varnish.sh)
#   nginx    proxy_cache on tmpfs, keys_zone sized for N keys (as .../proxies/nginx.sh)
# Memory: the sum of PSS (/proc/PID/smaps_rollup) over the target's processes, so memory shared
# by nginx's workers or varnish's manager and child counts once, plus, for nginx, the tmpfs its
# cache files occupy (`du`: whole pages per file); before the fill and after it. Objects: what
# the target says it holds (lacquer's admin /stats, varnishstat MAIN.n_object, nginx's cache
# files). Per object = growth / objects, next to the target's own accounting where it has one.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=$(pwd)/target/release/lacquer
N=1000000
TARGETS="lacquer varnish nginx"
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --objects) N=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer -q
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/memory-per-object.XXXXXX)
SHM=$(mktemp -d /dev/shm/memory-per-object.XXXXXX)
chmod 755 "$WORK" "$SHM"   # nginx's workers (www-data) use them
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT
# every process of the tree rooted at $1 (the root included)
tree() {
  local all=$1 frontier=$1 next
  while [ -n "$frontier" ]; do
    next=$(for p in $frontier; do cat /proc/"$p"/task/*/children 2>/dev/null; done | tr '\n' ' ')
    all="$all $next"; frontier=$next
  done
  echo "$all"
}
# PSS of the tree in KiB
pss_kb() {
  local total=0 kb
  for p in $(tree "$1"); do
    kb=$(awk '/^Pss:/ { print $2 }' /proc/"$p"/smaps_rollup 2>/dev/null || echo 0)
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}

# the origin: nginx answering every /o/ URL from memory
ORIGIN_PORT=$(free_port)
mkdir -p "$WORK/origin/tmp"
cat >"$WORK/origin/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $WORK/origin/nginx.pid;
error_log $WORK/origin/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $WORK/origin/tmp/body;
    proxy_temp_path $WORK/origin/tmp/proxy;
    fastcgi_temp_path $WORK/origin/tmp/fastcgi;
    uwsgi_temp_path $WORK/origin/tmp/uwsgi;
    scgi_temp_path $WORK/origin/tmp/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$ORIGIN_PORT backlog=4096;
        default_type text/html;
        location /o/ {
            add_header Cache-Control "public, max-age=3600";
            return 200 "<!doctype html><title>object</title><p>\$uri</p>\n";
        }
        location = /__status { stub_status; }
    }
}
CONF
nginx -c "$WORK/origin/nginx.conf" -p "$WORK/origin" -e "$WORK/origin/error.log" &
PIDS+=($!)
wait_port "$ORIGIN_PORT" 20
origin_requests() {
  curl -s "http://127.0.0.1:$ORIGIN_PORT/__status" | awk 'NR == 3 { print $3 }'
}

cat >"$WORK/fill.lua" <<'LUA'
-- /o/<thread>-<1..per>, in order, then the same again (hits) until wrk is stopped
local counter = 0
local nthreads = 0
function setup(thread)
   nthreads = nthreads + 1
   thread:set("tid", nthreads)
end
function init(args)
   per = tonumber(args[1])
end
function request()
   counter = counter % per + 1
   return wrk.format(nil, "/o/" .. tid .. "-" .. counter)
end
LUA

start_target() { # name port; sets TARGET_PID (not in a subshell: its exit would run the trap)
  local name=$1 port=$2
  case $name in
    lacquer)
      local admin
      admin=$(free_port)
      echo "$admin" >"$WORK/admin_port"
      cat >"$WORK/lacquer.toml" <<EOF
listen = ["127.0.0.1:$port"]
upstream = "127.0.0.1:$ORIGIN_PORT"
threads = 2
[cache]
memory_size = "4GiB"
estimated_objects = $N
[log]
access = "off"
[admin]
listen = "127.0.0.1:$admin"
EOF
      "$BIN" --config "$WORK/lacquer.toml" >"$WORK/lacquer.log" 2>&1 &
      ;;
    varnish)
      varnishd -F -n "$WORK/varnish" -a "127.0.0.1:$port" -b "127.0.0.1:$ORIGIN_PORT" \
        -T "127.0.0.1:$(free_port)" -s malloc,4096m -p thread_pools=2 >"$WORK/varnish.log" 2>&1 &
      ;;
    nginx)
      mkdir -p "$WORK/nginx/tmp" "$SHM/cache" "$SHM/tmp"
      # one megabyte of keys_zone holds about 8,000 keys
      local zone=$(((N / 8000 + 1) * 2))
      cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/tmp/body;
    proxy_temp_path $SHM/tmp;
    fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
    uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
    scgi_temp_path $WORK/nginx/tmp/scgi;
    sendfile on;
    tcp_nopush off;
    proxy_cache_path $SHM/cache levels=1:2 keys_zone=bench:${zone}m max_size=4096m inactive=1d use_temp_path=off;
    upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 128; }
    server {
        listen 127.0.0.1:$port backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            add_header X-Cache \$upstream_cache_status;
        }
    }
}
CONF
      nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" -e "$WORK/nginx/error.log" &
      ;;
    *) echo "unknown target $name" >&2; exit 2 ;;
  esac
  TARGET_PID=$!
}

# objects the target says it holds, and its own bytes figure where it has one
held() { # name pid
  case $1 in
    lacquer)
      curl -s "http://127.0.0.1:$(cat "$WORK/admin_port")/stats" |
        python3 -c 'import json,sys; s=json.load(sys.stdin); m=s.get("memory", s); print(m["objects"], m["bytes"])' ;;
    varnish)
      echo "$(varnishstat -n "$WORK/varnish" -1 -f MAIN.n_object | awk '{ print $2 }') -" ;;
    nginx)
      echo "$(find "$SHM/cache" -type f | wc -l) -" ;;
  esac
}
extra_kb() { # memory outside the processes: nginx's cache files on tmpfs
  if [ "$1" = nginx ]; then du -sk "$SHM/cache" | awk '{ print $1 }'; else echo 0; fi
}

printf '| target | objects held | memory before | after | per object | own accounting per object |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
for name in $TARGETS; do
  port=$(free_port)
  start_target "$name" "$port"
  pid=$TARGET_PID
  PIDS+=("$pid")
  wait_port "$port" 20
  # warm the target's own buffers and pools on a few objects outside the fill
  for i in $(seq 1 64); do curl -s -o /dev/null "http://127.0.0.1:$port/o/warm-$i"; done
  sleep 2
  before=$(($(pss_kb "$pid") + $(extra_kb "$name")))
  start=$(origin_requests)
  wrk -t 2 -c 64 -d 3600s -s "$WORK/fill.lua" "http://127.0.0.1:$port" -- $((N / 2)) \
    >"$WORK/wrk-$name.txt" 2>&1 &
  WRK=$!
  PIDS+=($WRK)
  while [ $(($(origin_requests) - start)) -lt "$N" ]; do
    kill -0 "$WRK" 2>/dev/null || { echo "wrk stopped early:" >&2; cat "$WORK/wrk-$name.txt" >&2; exit 1; }
    sleep 1
  done
  kill "$WRK"; wait "$WRK" 2>/dev/null || true
  # a sample of the fill must now be hits (the origin sees none of it)
  seen=$(origin_requests)
  for i in $(seq 1 1000); do
    curl -s -o /dev/null "http://127.0.0.1:$port/o/$((i % 2 + 1))-$(((i * 997) % (N / 2) + 1))"
  done
  refetched=$(($(origin_requests) - seen - 1))
  sleep 3
  after=$(($(pss_kb "$pid") + $(extra_kb "$name")))
  read -r objects own_bytes <<<"$(held "$name" "$pid")"
  per=$(((after - before) * 1024 / objects))
  own="-"
  [ "$own_bytes" != "-" ] && own="$((own_bytes / objects)) B"
  printf '| %s | %s | %s MB | %s MB | %s B | %s |\n' "$name" "$objects" $((before / 1024)) \
    $((after / 1024)) "$per" "$own"
  [ "$refetched" -gt 10 ] && echo "  ($name: $refetched of 1,000 sampled objects were fetched again)"
  for p in $(tree "$pid"); do kill "$p" 2>/dev/null || true; done
  wait "$pid" 2>/dev/null || true
  rm -rf "${SHM:?}/cache" "${SHM:?}/tmp"
done
