#!/usr/bin/env bash
# System calls per request, Lacquer beside nginx, counted by `strace -c -f` attached to each
# proxy while a client sends N requests (kernel time is about half of a forwarded request's CPU,
# and each call is a kernel entry: this is the count to compare, not the time strace reports).
#
#   bench/syscalls.sh                          # every kind, this tree's release build and nginx
#   bench/syscalls.sh --kinds miss,close       # some kinds
#   bench/syscalls.sh --bin /tmp/lacquer-base  # another build, for an A/B
#   bench/syscalls.sh --requests 2000 --no-nginx
#   bench/syscalls.sh --threads 2              # Lacquer with 2 worker threads (the harness's
#                                              # count: wake-ups that cross threads show here)
#
# Kinds (the origin is bench/pass_origin.sh, nginx answering at once from memory, 1 KB):
#   miss     GET of a URL never asked before, stored (keep-alive)
#   nostore  GET of one URL the origin answers `no-store`: a pass (keep-alive)
#   post     POST with a 100-byte form body: a pass (keep-alive)
#   close    GET of a stored 1 KB page with `Connection: close`, a new connection per request
#            (the harness's close1k)
#
# Both proxies run one worker (Lacquer `--threads 1` unless `--threads`, nginx `worker_processes 1`) with the shared
# harness's nginx config (../shared/bench/proxies/nginx.sh: proxy_cache on tmpfs, upstream
# keep-alive). Output: per kind and target, calls per request in total and by name (those made
# at least 0.05 times per request).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
find_harness
BIN=$(pwd)/target/release/lacquer
REQUESTS=2000
KINDS=miss,nostore,post,close
NGINX=1
THREADS=1
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --no-nginx) NGINX=0; shift ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$NGINX" = 0 ] || [ -d "${HARNESS:-}" ] || { echo "the shared harness is not found: set HARNESS" >&2; exit 2; }
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer -q

WORK=$(mktemp -d /tmp/syscalls.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT

ORIGIN_PORT=$(free_port)
LISTEN_PORT=$ORIGIN_PORT RUN_DIR=$WORK/origin WORKERS=1 bench/pass_origin.sh >"$WORK/origin.log" 2>&1 &
PIDS+=($!)
LACQUER_PORT=$(free_port)
printf '[invalidation]\npoll_interval = "10s"\n' >"$WORK/lacquer.toml"
"$BIN" --config "$WORK/lacquer.toml" --listen 127.0.0.1:"$LACQUER_PORT" --upstream 127.0.0.1:"$ORIGIN_PORT" \
  --threads "$THREADS" --memory-size 512MiB --access-log off >"$WORK/lacquer.log" 2>&1 &
PIDS+=($!)
TARGETS="lacquer=$!:$LACQUER_PORT"
if [ "$NGINX" = 1 ]; then
  NGINX_PORT=$(free_port)
  # nginx's workers run as nobody: they write the cache under SHM_DIR
  chmod 755 "$WORK" && mkdir -p "$WORK/nginx-shm/cache" "$WORK/nginx-shm/tmp" && chmod -R 777 "$WORK/nginx-shm"
  LISTEN_PORT=$NGINX_PORT ORIGIN_PORT=$ORIGIN_PORT RUN_DIR=$WORK/nginx SHM_DIR=$WORK/nginx-shm WORKERS=1 \
    "$HARNESS/proxies/nginx.sh" >"$WORK/nginx.log" 2>&1 &
  PIDS+=($!)
  wait_port "$NGINX_PORT"
  # the worker is the master's only child
  NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx/nginx.pid")" | head -1)
  TARGETS="$TARGETS nginx=$NGINX_WORKER:$NGINX_PORT"
fi
wait_port "$ORIGIN_PORT"
wait_port "$LACQUER_PORT"

cat >"$WORK/client.py" <<'PY'
import socket, sys
port, n, kind, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

def read_response(sock, buf):
    """One response (Content-Length framed) from sock; returns (status, leftover bytes)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("connection closed before a response head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("connection closed inside a body")
        rest += chunk
    if status != 200 or length != 1024:
        raise SystemExit(f"status {status}, {length} bytes")
    return rest[length:]

def request(path, method="GET", body=b"", close=False):
    extra = b"Connection: close\r\n" if close else b""
    if method == "POST":
        extra += b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n" % len(body)
    return b"%s %s HTTP/1.1\r\nHost: bench\r\n%s\r\n%s" % (method.encode(), path.encode(), extra, body)

if kind == "close":
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(request("/cacheable/hot", close=True))
        read_response(s, b"")
        s.close()
else:
    s = socket.create_connection(("127.0.0.1", port))
    buf = b""
    for i in range(n):
        if kind == "miss":
            s.sendall(request(f"/cacheable/{tag}-{i}"))
        elif kind == "nostore":
            s.sendall(request("/nostore/same"))
        else:
            s.sendall(request(f"/post/{tag}", "POST", b"q=" + b"a" * 98))
        buf = read_response(s, buf)
        if i % 500 == 499:
            # nginx closes a connection after 1,000 requests (keepalive_requests)
            s.close()
            s = socket.create_connection(("127.0.0.1", port))
    s.close()
PY

IFS=, read -ra KIND_LIST <<<"$KINDS"
for kind in "${KIND_LIST[@]}"; do
  for target in $TARGETS; do
    name=${target%%=*}
    pid=${target#*=}
    pid=${pid%%:*}
    port=${target##*:}
    # warm: the upstream pool, the stored page for `close`, the allocator
    python3 "$WORK/client.py" "$port" 300 "$kind" "warm-$name"
    strace -c -f -p "$pid" -o "$WORK/strace-$kind-$name" &
    STRACE=$!
    sleep 0.5
    python3 "$WORK/client.py" "$port" "$REQUESTS" "$kind" "measured-$name"
    kill -INT "$STRACE"
    wait "$STRACE" 2>/dev/null || true
    awk -v n="$REQUESTS" -v label="$kind $name" '
      $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { calls = $4; sc = $NF; total += calls; if (calls / n >= 0.05) by[sc] = calls / n }
      END {
        printf "%-14s %6.2f calls per request:", label, total / n
        for (s in by) printf " %s %.2f", s, by[s]
        printf "\n"
      }' "$WORK/strace-$kind-$name"
  done
done
