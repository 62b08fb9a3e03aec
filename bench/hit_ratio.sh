#!/usr/bin/env bash
# Issue 18 item 5: hit ratio at equal memory. One fixed trace per Zipf exponent (1,000,000
# distinct URLs, sizes 2 KB-1 MB, seed below) replayed from an empty cache through Lacquer
# (memory tier only), Varnish, nginx and Traffic Server, each given CACHE_MB of cache memory; the
# origin (bench/hit_ratio/origin.py) counts what reaches it, so hit ratio, byte hit ratio and
# origin requests are measured at the origin, not taken from a proxy's word.
#
# Usage: bench/hit_ratio.sh [report.md]
# Environment: REQUESTS (per trace, default 400000), ZIPFS ("0.9 1.1"), SEED (18), OBJECTS
# (1000000), CACHE_MB (256), CONNS (32), PROXIES ("lacquer varnish nginx ats lacquer-nginxmem";
# nginx-paced may be added; lacquer-nginxmem must come after nginx), NGINX_RATE (200 req/s, for
# nginx-paced), LACQUER (a release binary; default: cargo build --release), HARNESS (the shared
# harness, for the anchors' start scripts proxies/{varnish,nginx,ats}.sh, used unchanged with
# CACHE_MB), BASE_PORT (27100: the origin, then BASE_PORT+10, +20, ... for the proxies).
# tmpfs caches under /dev/shm/hit-ratio.<pid>. About 13 minutes with the default PROXIES;
# nginx-paced adds REQUESTS / NGINX_RATE seconds per trace (33 minutes at the defaults).
#
# Cache memory per proxy (CACHE_MB = 256):
#   lacquer  [cache] memory_size = "256MiB" (bodies + headers + per-object overhead), no memcached
#   varnish  -s malloc,256m (builtin VCL; objects + their storage overhead)
#   nginx    proxy_cache max_size=256m on tmpfs (nginx counts each file's size on disk, rounded up
#            to the block size, headers included); keys_zone 64m, which holds ~500k keys and never
#            binds here (a few thousand objects fit in 256 MB). nginx's cache manager looks at
#            max_size at most every 10 s and then deletes at most manager_files (100) files per
#            manager_sleep (50 ms), so at this replay's fill rate (thousands of misses a second)
#            its directory holds several times max_size. The sampled tmpfs footprint is reported;
#            lacquer-nginxmem is Lacquer given nginx's mean footprint (equal mean memory), and
#            nginx-paced is nginx with the replay held to NGINX_RATE, slow enough for its cache
#            manager to keep the directory near max_size (equal memory, at nginx's own pace).
#   ats      proxy.config.cache.ram_cache.size = 256 MB and a 256 MB cache "disk" file on tmpfs:
#            ATS only serves what its disk directory holds (the RAM cache is a copy of part of
#            it), so the 256 MB store bounds what it can hit; the RAM cache adds speed, not hits
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hit_ratio/lib.sh
. bench/hit_ratio/lib.sh
REPORT=${1:-}
NGINX_RATE=${NGINX_RATE:-200}; REQUESTS=${REQUESTS:-400000}; ZIPFS=${ZIPFS:-"0.9 1.1"}; SEED=${SEED:-18}; OBJECTS=${OBJECTS:-1000000}
CACHE_MB=${CACHE_MB:-256}; CONNS=${CONNS:-32}; PROXIES=${PROXIES:-"lacquer varnish nginx ats lacquer-nginxmem"}
HARNESS=${HARNESS:-$(cd ../shared/bench 2>/dev/null && pwd || echo /work/shared/bench)}
BASE_PORT=${BASE_PORT:-27100}; ORIGIN_PORT=$BASE_PORT
DIR=$(mktemp -d /tmp/hit-ratio.XXXX); SHM=/dev/shm/hit-ratio.$$
if [ -z "${LACQUER:-}" ]; then cargo build --release --bin lacquer -q; LACQUER=$(pwd)/target/release/lacquer; fi

ORIGIN_PID=""; PROXY_PID=""; SAMPLER=""
cleanup() { [ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null || true; stop_tree "$PROXY_PID"; stop_tree "$ORIGIN_PID"; rm -rf "$DIR" "$SHM"; }
trap cleanup EXIT

# Every 2 s until killed: "PSS MB, tmpfs MB" of the proxy (its process tree, its tmpfs cache).
sample_memory() { while sleep 2; do echo "$(pss_mb "$1") $(( $(du -sk "$2" 2>/dev/null | cut -f1 || true) / 1024 ))"; done; }

start_proxy() { # $1 = proxy, $2 = port, $3 = cache MB; sets PROXY_PID
  local p=$1 port=$2 mb=$3 run=$DIR/$1
  rm -rf "$run" "$run.log" "$SHM/$p"; mkdir -p "$run" "$SHM/$p"
  if [ "${p%%-*}" = lacquer ]; then
    cat > "$run/lacquer.toml" <<TOML
listen = ["127.0.0.1:$port"]
upstream = "127.0.0.1:$ORIGIN_PORT"
threads = 2
[log]
access = "off"
[cache]
memory_size = "${mb}MiB"
max_object_size = "2MiB"
TOML
    setsid "$LACQUER" --config "$run/lacquer.toml" --log-level warn >"$run.log" 2>&1 </dev/null &
  else
    LISTEN_PORT=$port ORIGIN_PORT=$ORIGIN_PORT RUN_DIR=$run SHM_DIR=$SHM/$p CACHE_MB=$mb WORKERS=2 \
      setsid bash "$HARNESS/proxies/${p%%-*}.sh" >"$run.log" 2>&1 </dev/null &
  fi
  PROXY_PID=$!
  wait_port "$port" || { cat "$run.log" >&2; exit 1; }
}

setsid python3 bench/hit_ratio/origin.py "$ORIGIN_PORT" >"$DIR/origin.log" 2>&1 </dev/null &
ORIGIN_PID=$!
wait_port "$ORIGIN_PORT"
echo "hit ratio at equal memory: $OBJECTS URLs, $REQUESTS requests per trace, seed $SEED, ${CACHE_MB} MB per proxy, $CONNS connections"
for z in $ZIPFS; do
  python3 bench/hit_ratio/make_trace.py "$DIR/trace-$z.txt" --objects "$OBJECTS" --requests "$REQUESTS" \
    --zipf "$z" --seed "$SEED" | tee -a "$DIR/traces.txt"
  i=0
  for p in $PROXIES; do
    i=$((i + 1)); port=$((BASE_PORT + 10 * i))
    mb=$CACHE_MB
    # lacquer-nginxmem: Lacquer again, given what nginx's cache directory really held (its mean in
    # the second half): nginx's cache manager lets it grow well past max_size between passes.
    if [ "$p" = lacquer-nginxmem ]; then mb=$(python3 bench/hit_ratio/memory.py mean "$DIR/memory.jsonl" "nginx s=$z"); fi
    start_proxy "$p" "$port" "$mb"
    sample_memory "$PROXY_PID" "$SHM/$p" > "$DIR/samples" & SAMPLER=$!
    rate=0; if [ "$p" = nginx-paced ]; then rate=$NGINX_RATE; fi
    python3 bench/hit_ratio/replay.py "$DIR/trace-$z.txt" "127.0.0.1:$port" "127.0.0.1:$ORIGIN_PORT" \
      --conns "$CONNS" --label "$p s=$z" --json "$DIR/results.jsonl" --rate "$rate"
    kill "$SAMPLER"; wait "$SAMPLER" 2>/dev/null || true
    python3 bench/hit_ratio/memory.py summary "$DIR/samples" "$p s=$z" "$p" "$z" "$mb" >> "$DIR/memory.jsonl"
    stop_tree "$PROXY_PID"; PROXY_PID=""
    rm -rf "$SHM/$p"
  done
done
python3 bench/hit_ratio/report.py "$DIR/results.jsonl" "$DIR/memory.jsonl" "$DIR/traces.txt" \
  --title "Hit ratio at equal memory (${CACHE_MB} MB), $(date -u +%Y-%m-%d)" \
  --setup "$OBJECTS URLs, $REQUESTS requests per trace, seed $SEED, $CONNS connections, lacquer $("$LACQUER" --version 2>/dev/null | head -1)" \
  > "$DIR/report.md"
cat "$DIR/report.md"
if [ -n "$REPORT" ]; then cp "$DIR/report.md" "$REPORT"; fi
