#!/usr/bin/env bash
# What client connections cost in memory, and whether it comes back when they close: RSS of a
# release lacquer (and the demo origin behind it) at rest, with N connections open, and after
# they are closed. Loopback only; about a minute.
#
#   bench/idle_connections.sh                     # 2,000 connections of each kind (300 large)
#   bench/idle_connections.sh --connections 500 --large 100 --kinds "idle large"
#   bench/idle_connections.sh --bin /tmp/lacquer-old --env MIMALLOC_PURGE_DELAY=0
#   bench/idle_connections.sh --server 'read_buffer = "64KiB"' --server 'memory_return_delay = "0s"'
#
# Four kinds, one after the other, each on a fresh process:
#   idle     one GET answered, then the connection is kept alive and silent
#   partial  a 1 KiB request head that is never finished (waits for the head deadline)
#   h2c      an HTTP/2 preface and SETTINGS, then nothing
#   large    a 512 KiB request head that is never finished (over server.max_header_size)
# RSS is read from /proc/PID/status (VmRSS) at rest, with the connections open, 3 s after they
# were all closed, and 15 s after, with the open connections' cost each (growth over rest / N).
# `--server LINE` adds a line to the config's [server] section. The head deadline is set long (60 s) so the partial heads
# are still open when RSS is read.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
BIN=$(pwd)/target/release/lacquer
N=2000
LARGE=300
KINDS="idle partial h2c large"
ENVS=()
SERVER_LINES=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --connections) N=$2; shift 2 ;;
    --large) LARGE=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --server) SERVER_LINES+=("$2"); shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$BIN" = "$(pwd)/target/release/lacquer" ] && cargo build --release --bin lacquer --bin demo-origin -q
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/idle-connections.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

ORIGIN=127.0.0.1:$(free_port)
target/release/demo-origin --listen "$ORIGIN" --render-ms 0 >/dev/null 2>&1 &
PIDS+=($!)

cat >"$WORK/clients.py" <<'PY'
import os, socket, sys, time
pid, port, n, kind = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def rss_kb():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1

def rss():
    return rss_kb() // 1024

def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

time.sleep(1)
at_rest_kb = rss_kb()
at_rest = at_rest_kb // 1024
conns = []
for i in range(n):
    s = connect()
    if kind == "idle":
        s.sendall(b"GET /page/%d HTTP/1.1\r\nHost: bench\r\n\r\n" % (i % 50))
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
        while len(body) < length:
            body += s.recv(65536)
    elif kind == "partial":
        s.sendall(b"GET /page/1 HTTP/1.1\r\nHost: bench\r\nX-Slow: " + b"a" * 1000)
    elif kind == "h2c":
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    elif kind == "large":
        s.setblocking(False)
        try:
            s.send(b"GET /page/1 HTTP/1.1\r\nHost: bench\r\nX-Large: " + b"a" * (512 << 10))
        except BlockingIOError:
            pass
    conns.append(s)
time.sleep(3)
open_kb = rss_kb()
open_rss = open_kb // 1024
for s in conns:
    s.close()
time.sleep(3)
closed_3s = rss()
time.sleep(12)
closed_15s = rss()
print(f"{kind:8} {n:6} connections: RSS at rest {at_rest} MB, open {open_rss} MB, "
      f"closed +3 s {closed_3s} MB, +15 s {closed_15s} MB; "
      f"{(open_kb - at_rest_kb) / n:.1f} KB per open connection")
PY

for kind in $KINDS; do
  PORT=$(free_port)
  cat >"$WORK/lacquer.toml" <<EOF
listen = ["127.0.0.1:$PORT"]
upstream = "$ORIGIN"
threads = 2
[server]
header_read_timeout = "60s"
h2_idle_timeout = "60s"
max_connections = $((N + 100))
$([ ${#SERVER_LINES[@]} -gt 0 ] && printf '%s\n' "${SERVER_LINES[@]}")
[log]
access = "off"
EOF
  if ! "$BIN" --check-config "$WORK/lacquer.toml" >/dev/null 2>&1; then
    # a build without the [server] limits
    printf 'listen = ["127.0.0.1:%s"]\nupstream = "%s"\nthreads = 2\n[log]\naccess = "off"\n' \
      "$PORT" "$ORIGIN" >"$WORK/lacquer.toml"
  fi
  env "${ENVS[@]}" "$BIN" --config "$WORK/lacquer.toml" >"$WORK/lacquer.log" 2>&1 &
  LQ=$!
  PIDS+=($LQ)
  for _ in $(seq 1 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT)).close()" 2>/dev/null && break
    sleep 0.1
  done
  count=$N
  [ "$kind" = large ] && count=$LARGE
  python3 "$WORK/clients.py" "$LQ" "$PORT" "$count" "$kind"
  kill "$LQ"; wait "$LQ" 2>/dev/null || true
done
