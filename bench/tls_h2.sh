#!/usr/bin/env bash
# A 1 KB hot hit over TLS 1.3 and over h2, Lacquer beside nginx and HAProxy, measured the shared
# harness's way (../shared/bench): its daemon life cycle (lib/common.sh) and its measurement
# driver (lib/bench.py: the client pinned to CPU 0 and each target to CPU 1, warm-up, interleaved
# rounds, requests per target CPU-second, noise control, the same report), with three scenarios
# the harness does not have:
#
#   tls1k        HTTP/1.1 over TLS, keep-alive (wrk -c 64)
#   tls_close1k  HTTP/1.1 over TLS, a new connection (a full handshake) per request (wrk, with
#                `Connection: close`)
#   h2_1k        h2 over TLS, 32 connections x 10 streams (h2load -c 32 -m 10; h2load reports no
#                percentiles, so the latency columns are 0 in h2 rows)
#
# Every target gets the same certificate (ECDSA P-256, made here) and offers TLS 1.3 and h2
# through ALPN; each caches the shared harness's origin (nginx, its generated docroot).
#
#   bench/tls_h2.sh                                     # 5 rounds x 4 s, this tree's build
#   bench/tls_h2.sh --rounds 3 --scenarios h2_1k
#   bench/tls_h2.sh --lacquer lacquer-base=/tmp/lacquer-base   # one more Lacquer build beside
#
# Results: /tmp/tls-run/results/<run-id>/report.md (and results.csv, raw/).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
find_harness
[ -d "${HARNESS:-}" ] || { echo "the shared harness is not found: set HARNESS" >&2; exit 2; }
command -v h2load >/dev/null || apt-get install -y -q nghttp2-client >/dev/null
ROUNDS=5
DURATION=4
WARMUP=2
WORKERS=2
CACHE_MB=512
TARGET_LIST=nginx,haproxy,lacquer
SCENARIOS=tls1k,h2_1k,tls_close1k
declare -A LACQUER_BINS=()
LACQUER_NAMES=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --proxies) TARGET_LIST=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --lacquer) LACQUER_BINS[${2%%=*}]=${2#*=}; LACQUER_NAMES+=("${2%%=*}"); shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case ",$TARGET_LIST," in
  *,lacquer,*)
    if [ -z "${LACQUER_BINS[lacquer]:-}" ]; then
      cargo build --release --bin lacquer -q
      LACQUER_BINS[lacquer]=$(pwd)/target/release/lacquer
    fi ;;
esac
IFS=, read -r -a TARGETS <<<"$TARGET_LIST"
for n in "${LACQUER_NAMES[@]}"; do
  case ",$TARGET_LIST," in *,"$n",*) ;; *) TARGETS+=("$n") ;; esac
done

export BENCH_RUN=/tmp/tls-run BENCH_SHM=/dev/shm/tls-run
# shellcheck source=/dev/null
source "$HARNESS/lib/common.sh"
RUN_ID=$(date +%Y%m%d-%H%M%S)
OUT=$RUN/results/$RUN_ID
mkdir -p "$RUN/pids" "$RUN/logs" "$SHM" "$OUT" "$RUN/tls"
for f in "$RUN"/pids/*.pid; do
  [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && die "daemon from an earlier run still alive ($f)"
done
trap 'stop_all' EXIT
trap 'exit 130' INT TERM

CERT=$RUN/tls/cert.pem KEY=$RUN/tls/key.pem
tls_certificate "$CERT" "$KEY"
cat "$CERT" "$KEY" >"$RUN/tls/haproxy.pem"

DOCROOT=$RUN/www
python3 "$HARNESS/origin/gen_content.py" "$DOCROOT" 100 >/dev/null
ORIGIN_PORT=$(free_port)
LISTEN_PORT=$ORIGIN_PORT SLOW_PORT=$(free_port) RUN_DIR=$RUN/origin DOCROOT=$DOCROOT WORKERS=$WORKERS \
  start_daemon origin "$HARNESS/origin/nginx.sh" >/dev/null
wait_port "$ORIGIN_PORT" 20 "$(cat "$RUN/pids/origin.pid")" || die "origin did not start: $(tail -5 "$RUN/logs/origin.log")"

# The start script of target $1 listening with TLS on $2, written to stdout.
start_script() {
  local name=$1 port=$2 dir=$RUN/proxies/$1
  case $name in
    nginx) cat <<EOF
mkdir -p $dir/tmp $SHM/$name/cache
cat >$dir/nginx.conf <<'CONF'
worker_processes $WORKERS;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 8192; }
http {
    access_log off;
    # the default (1000) closes each h2 connection after 1000 requests, failing the streams in flight
    keepalive_requests 1000000;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $SHM/$name/tmp;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    sendfile on;
    proxy_cache_path $SHM/$name/cache levels=1:2 keys_zone=bench:64m max_size=${CACHE_MB}m inactive=1d use_temp_path=off;
    upstream origin { server 127.0.0.1:$ORIGIN_PORT; keepalive 128; }
    server {
        listen 127.0.0.1:$port ssl http2 backlog=4096;
        ssl_certificate $CERT;
        ssl_certificate_key $KEY;
        ssl_protocols TLSv1.3;
        http2_max_concurrent_streams 128;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
        }
    }
}
CONF
exec nginx -c $dir/nginx.conf -p $dir -e $dir/error.log
EOF
      ;;
    haproxy) cat <<EOF
cat >$dir/haproxy.cfg <<'CONF'
global
    nbthread $WORKERS
    maxconn 8000
    ssl-default-bind-options ssl-min-ver TLSv1.3
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
cache bench
    total-max-size $CACHE_MB
    max-age 3600
    max-object-size 2097152
    process-vary on
frontend fe
    bind 127.0.0.1:$port ssl crt $RUN/tls/haproxy.pem alpn h2,http/1.1
    default_backend origin
backend origin
    http-request cache-use bench
    http-response cache-store bench
    server o1 127.0.0.1:$ORIGIN_PORT
CONF
exec haproxy -db -f $dir/haproxy.cfg
EOF
      ;;
    *) [ -n "${LACQUER_BINS[$name]:-}" ] || die "no target named $name (nginx, haproxy, or --lacquer $name=BIN)"
      cat <<EOF
cat >$dir/lacquer.toml <<'CONF'
[tls]
listen = ["127.0.0.1:$port"]
cert = "$CERT"
key = "$KEY"
CONF
exec ${LACQUER_BINS[$name]} --config $dir/lacquer.toml --listen 127.0.0.1:$(free_port) \
  --upstream 127.0.0.1:$ORIGIN_PORT --threads $WORKERS --memory-size ${CACHE_MB}MiB --access-log off
EOF
      ;;
  esac
}

TARGET_ARGS=()
for n in "${TARGETS[@]}"; do
  port=$(free_port)
  rm -rf "${RUN:?}/proxies/$n" "${SHM:?}/$n"
  mkdir -p "$RUN/proxies/$n" "$SHM/$n"
  start_script "$n" "$port" >"$RUN/proxies/$n.sh"
  start_daemon "$n" "$RUN/proxies/$n.sh" >/dev/null
  wait_port "$port" 60 "$(cat "$RUN/pids/$n.pid")" || die "$n did not start: $(tail -5 "$RUN/logs/$n.log")"
  TARGET_ARGS+=(--target "$n=$port=$(cat "$RUN/pids/$n.pid")")
done
sleep 0.5

# every target answers the page over TLS 1.3, with h2 offered, and serves it from its cache
for arg in "${TARGET_ARGS[@]}"; do
  [ "$arg" = --target ] && continue
  name=${arg%%=*} rest=${arg#*=} port=${rest%%=*}
  url=https://127.0.0.1:$port/1k.html
  for _ in 1 2 3; do curl -ksf -o /dev/null "$url" || die "$name: GET $url failed"; done
  got=$(curl -ks -o /dev/null -w '%{http_code} %{size_download} %{http_version}' --http2 "$url")
  [ "$got" = "200 1024 2" ] || die "$name: h2 GET $url gave '$got', not '200 1024 2'"
  tls=$(echo | openssl s_client -connect "127.0.0.1:$port" 2>/dev/null | sed -n 's/^ *Protocol *: *//p; s/^New, \(TLSv[0-9.]*\),.*/\1/p' | head -1)
  [ "$tls" = TLSv1.3 ] || die "$name: negotiated '$tls', not TLSv1.3"
  before=$(curl -s "http://127.0.0.1:$ORIGIN_PORT/__status" | sed -n 3p | awk '{print $3}')
  for _ in 1 2 3 4 5; do curl -ksf -o /dev/null "$url"; done
  after=$(curl -s "http://127.0.0.1:$ORIGIN_PORT/__status" | sed -n 3p | awk '{print $3}')
  [ $((after - before - 1)) -eq 0 ] || die "$name: the origin saw $((after - before - 1)) of 5 repeated requests (not cached)"
  echo "verified $name: 200, 1024 bytes, h2 through ALPN, TLSv1.3, served from its cache" >&2
done

python3 - "$HARNESS/lib" "$OUT" "$RUN" "$ORIGIN_PORT" "$(cat "$RUN/pids/origin.pid")" "$ROUNDS" "$DURATION" \
  "$WARMUP" "$SCENARIOS" "$RUN_ID" "${TARGET_ARGS[@]}" <<'PY'
import os, re, subprocess, sys
lib, out, run, origin_port, origin_pid, rounds, duration, warmup, scenarios, run_id = sys.argv[1:11]
targets = sys.argv[11:]
sys.path.insert(0, lib)
import bench  # the shared harness's driver: only its scenarios and client command are extended

bench.SCENARIOS["tls1k"] = dict(path="/1k.html", tls=True, desc="hot hit, 1 KB, HTTP/1.1 over TLS 1.3, keep-alive")
bench.SCENARIOS["tls_close1k"] = dict(path="/1k.html", tls=True, headers=["Connection: close"],
                                      desc="hot hit, 1 KB, HTTP/1.1 over TLS 1.3, a new connection (handshake) per request")
bench.SCENARIOS["h2_1k"] = dict(path="/1k.html", h2=True,
                                desc="hot hit, 1 KB, h2 over TLS 1.3, 32 connections x 10 streams (h2load)")
plain_wrk_cmd = bench.wrk_cmd
plain_run_wrk = bench.run_wrk

def wrk_cmd(sc, port, duration, args, tag):
    url = "https://127.0.0.1:%d%s" % (port, sc["path"])
    if sc.get("h2"):
        cmd = ["taskset", "-c", str(args.wrk_cpu)] if args.pin else []
        return cmd + ["h2load", "-c", "32", "-m", "10", "-t", "1", "-D", str(duration), url]
    cmd = plain_wrk_cmd(sc, port, duration, args, tag)
    cmd[-1] = url
    return cmd

def run_wrk(cmd, duration):
    if "h2load" not in cmd:
        return plain_run_wrk(cmd, duration)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=duration + 60)
    o = p.stdout
    fin = re.search(r"finished in ([\d.]+)(m?s)", o)
    req = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", o)
    codes = re.search(r"status codes: (\d+) 2xx", o)
    traffic = re.search(r"traffic: .*?\((\d+)\) total", o)
    lat = re.search(r"time for request:\s+\S+\s+(\S+)\s+(\S+)", o)
    if not (fin and req and codes):
        return None, o
    secs = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    def us(s):
        m = re.match(r"([\d.]+)(us|ms|s)", s)
        return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)] if m else 0
    ok = int(codes.group(1))
    return dict(requests=ok, duration_us=int(secs * 1e6), bytes=int(traffic.group(1)) if traffic else 0,
                err_connect=0, err_read=int(req.group(3)), err_write=0,
                err_status=int(req.group(1)) - ok + int(req.group(2)), err_timeout=int(req.group(4)),
                lat_mean_us=us(lat.group(2)) if lat else 0, lat_max_us=int(us(lat.group(1))) if lat else 0,
                p50_us=0, p90_us=0, p99_us=0, p999_us=0), o

bench.wrk_cmd = wrk_cmd
bench.run_wrk = run_wrk
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
