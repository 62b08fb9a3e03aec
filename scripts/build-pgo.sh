#!/usr/bin/env bash
# Builds Lacquer's release binary with profile-guided optimisation: target/pgo/lacquer.
#
# rustc builds the proxy once instrumented (-Cprofile-generate), that build serves a minute of
# the request paths an operator's traffic takes (below), and rustc builds it again with the
# counts it recorded (-Cprofile-use): the hot paths of Lacquer, Pingora, tokio and h2 inlined and
# laid out together, the cold ones moved aside. Measured against the plain release build
# (docs/benchmarks.md, "a profile-guided build"): about a quarter fewer user-space instructions
# per hit and per pass, and a fifth more misses per CPU-second under the shared harness's
# miss50ms. The plain `cargo build --release` stays what the tests and README.md use; this is
# the build to ship.
#
#   scripts/build-pgo.sh                 # target/pgo/lacquer
#   PHASE_SECONDS=8 scripts/build-pgo.sh # a longer training load (default 4 s per phase)
#   BOLT=0 scripts/build-pgo.sh          # without the BOLT layout
#
# It takes two release builds (about 8 minutes each on two cores) and about a minute of load.
# The training load, each phase against a real nginx origin (bench/pass_origin.sh) over
# loopback: 1 KB hits over HTTP/1.1 keep-alive, for identity and gzip clients, a new connection
# per hit, h2c hits (10 streams per connection), hits over 2,000 URLs, misses (every request a
# new URL, stored), `no-store` passes, POSTs; over TLS 1.3, hits over HTTP/1.1 (keep-alive and a
# new connection each) and over h2; then, with a memcached tier (local_ttl 0 s), misses filled
# into memcached and hits read from it. Paths no phase takes (purges, ranges, revalidation) are
# compiled as rarely run code: correct, and no faster than in the plain build.
#
# Then BOLT (LLVM's post-link optimiser, Debian's bolt-16) lays the optimised binary out again
# by the same training load, run once more on a BOLT-instrumented copy: the code the load runs
# packed together (hot functions ordered by who calls whom, each function's cold blocks moved
# out), so a request's instructions take fewer instruction-cache lines. Measured on this build
# (docs/benchmarks.md, "BOLT"): 11-14 % fewer mispredicted branches per pass and per hit, 2-9 %
# fewer simulated instruction-cache misses, the same instructions (over a freshly trained PGO
# build, which already does most of the layout work). It adds about three minutes. `BOLT=0` skips it (the build is then the
# profile-guided one alone); the optimised build is linked with `--emit-relocs`, which BOLT
# needs to move functions.
#
# Needs llvm-profdata of the LLVM that rustc uses (rustup's llvm-tools component, added when
# missing), wrk, h2load, openssl, nginx and memcached (installed with apt-get when missing), and
# bolt-16 unless BOLT=0.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
PHASE_SECONDS=${PHASE_SECONDS:-4}
BOLT=${BOLT:-1}

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v memcached >/dev/null || [ -x /usr/bin/memcached ] || need+=(memcached)
command -v openssl >/dev/null || need+=(openssl)
# (the versioned path: the runtime library of an instrumented build is found beside it)
bolt=/usr/lib/llvm-16/bin
[ "$BOLT" = 0 ] || [ -x "$bolt/llvm-bolt" ] || need+=(bolt-16)
. scripts/apt.sh
apt_install "${need[@]}"
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
[ -x "$profdata" ] || rustup component add llvm-tools
[ -x "$profdata" ] || { echo "build-pgo: no llvm-profdata at $profdata" >&2; exit 1; }

pgo=$(pwd)/target/pgo
rm -rf "$pgo/profiles"
mkdir -p "$pgo/profiles"
# `--target`: RUSTFLAGS then reach only the binary's crates, not build scripts or proc macros
build() {
  RUSTFLAGS="${RUSTFLAGS:-} $1" cargo build --release --locked --bin lacquer \
    --target "$host" --target-dir "$pgo/$2"
}

echo "build-pgo: 1/3 the instrumented build"
build "-Cprofile-generate=$pgo/profiles" generate

echo "build-pgo: 2/3 the training load (${PHASE_SECONDS} s per phase)"
work=$(mktemp -d /tmp/lacquer-pgo.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
origin_port=$(free_port)
LISTEN_PORT=$origin_port RUN_DIR=$work/origin bench/pass_origin.sh >"$work/origin.log" 2>&1 &
pids+=($!)
wait_port "$origin_port"
cat >"$work/new_urls.lua" <<'LUA'
local prefix = "/cacheable/" .. os.time() .. "-"
local n = 0
function request() n = n + 1; return wrk.format(nil, prefix .. n) end
LUA
cat >"$work/some_urls.lua" <<'LUA'
local n = 0
function request() n = n + 1; return wrk.format(nil, "/cacheable/w" .. (n % 2000)) end
LUA
cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "name=lacquer&value=1"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
LUA
load() { wrk -t1 -c16 -d"${PHASE_SECONDS}s" "$@" >>"$work/load.log"; }
# serve CONFIG_FILE: starts the instrumented proxy and sets $port; its profile is written at exit
serve() {
  port=$(free_port)
  LLVM_PROFILE_FILE="$pgo/profiles/lacquer-%p.profraw" "$instrumented" --config "$1" \
    --listen 127.0.0.1:"$port" --upstream 127.0.0.1:"$origin_port" --threads 2 \
    --memory-size 256MiB --access-log off >>"$work/lacquer.log" 2>&1 &
  proxy=$!
  pids+=("$proxy")
  wait_port "$port"
}
stop() { kill -TERM "$proxy"; wait "$proxy" || true; }

# train BINARY: the training load, served by BINARY (an instrumented build, which writes its
# profile as it exits)
train() {
  instrumented=$1
  : >"$work/load.log"
  # TLS 1.3 (one ECDSA P-256 certificate, as bench/tls_h2.sh): the handshake and record layer
  # (rustls, ring) are trained with the rest
  tls_certificate "$work/cert.pem" "$work/key.pem" 1
  tls_port=$(free_port)
  printf '[tls]\nlisten = ["127.0.0.1:%s"]\ncert = "%s"\nkey = "%s"\n' \
    "$tls_port" "$work/cert.pem" "$work/key.pem" >"$work/memory.toml"
  serve "$work/memory.toml"
  base=http://127.0.0.1:$port
  tls=https://127.0.0.1:$tls_port
  load "$base/cacheable/hot"
  load -H 'Accept-Encoding: gzip' "$base/cacheable/hot"
  load -H 'Connection: close' "$base/cacheable/hot"
  load -s "$work/some_urls.lua" "$base"
  load -s "$work/new_urls.lua" "$base"
  load "$base/nostore/x"
  load -s "$work/post.lua" "$base/post/x"
  h2load -c 4 -m 10 -D "$PHASE_SECONDS" "$base/cacheable/hot" >>"$work/load.log"
  load "$tls/cacheable/hot"
  load -H 'Connection: close' "$tls/cacheable/hot"
  h2load -c 4 -m 10 -D "$PHASE_SECONDS" "$tls/cacheable/hot" >>"$work/load.log"
  stop

  mc_port=$(free_port)
  memcached -p "$mc_port" -l 127.0.0.1 -U 0 -m 64 -u "$(id -un)" &
  pids+=($!)
  wait_port "$mc_port"
  printf '[cache.memcached]\nservers = ["127.0.0.1:%s"]\nlocal_ttl = "0s"\n' "$mc_port" >"$work/memcached.toml"
  serve "$work/memcached.toml"
  base=http://127.0.0.1:$port
  load -s "$work/new_urls.lua" "$base"
  load -s "$work/some_urls.lua" "$base"
  stop
  grep -E 'Requests/sec|^requests:' "$work/load.log" | sed 's/^/build-pgo:   /'
  # a profile of error answers would train the wrong paths
  if grep -E 'Non-2xx|[1-9][0-9]* failed' "$work/load.log"; then
    tail -n 20 "$work/lacquer.log" >&2
    echo "build-pgo: the training load got error answers (above, and the proxy's log)" >&2
    exit 1
  fi
}

train "$pgo/generate/$host/release/lacquer"

echo "build-pgo: 3/3 the optimised build"
"$profdata" merge -o "$pgo/lacquer.profdata" "$pgo"/profiles/lacquer-*.profraw
if [ "$BOLT" = 0 ]; then
  build "-Cprofile-use=$pgo/lacquer.profdata" use
  cp "$pgo/use/$host/release/lacquer" "$pgo/lacquer"
  echo "build-pgo: $pgo/lacquer"
  exit 0
fi
build "-Cprofile-use=$pgo/lacquer.profdata -Clink-arg=-Wl,--emit-relocs" use
optimised="$pgo/use/$host/release/lacquer"

echo "build-pgo: BOLT, the training load again on an instrumented copy"
rm -rf "$pgo/bolt"
mkdir -p "$pgo/bolt"
"$bolt/llvm-bolt" "$optimised" -instrument -o "$pgo/bolt/lacquer.instrumented" \
  -instrumentation-file="$pgo/bolt/profile" -instrumentation-file-append-pid >"$pgo/bolt/instrument.log" 2>&1 ||
  { tail -n 20 "$pgo/bolt/instrument.log" >&2; exit 1; }
train "$pgo/bolt/lacquer.instrumented"
"$bolt/merge-fdata" "$pgo"/bolt/profile.*.fdata >"$pgo/bolt/profile.fdata"
"$bolt/llvm-bolt" "$optimised" -o "$pgo/lacquer" -data="$pgo/bolt/profile.fdata" \
  -reorder-blocks=ext-tsp -reorder-functions=hfsort+ -split-functions -split-all-cold \
  -split-eh -icf=1 -use-gnu-stack -dyno-stats >"$pgo/bolt/optimise.log" 2>&1 ||
  { tail -n 20 "$pgo/bolt/optimise.log" >&2; exit 1; }
echo "build-pgo: $pgo/lacquer (profile-guided, laid out by BOLT)"
