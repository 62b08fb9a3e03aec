# Helpers every bench script starts with; source it after `cd`-ing to the repository's root:
#   . bench/lib.sh

# A port nothing listens on now (the kernel's pick), on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A process's CPU time so far, in clock ticks (`getconf CLK_TCK` a second): "USER SYSTEM".
user_system_ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }

# The context switches, voluntary and not, of all a process's threads so far.
context_switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ { n += $2 } END { print n }'; }

# Waits until something accepts connections on 127.0.0.1:PORT, polling every 0.1 s for at most
# SECONDS (default 10); fails (with `set -e`, ends the script) if nothing does.
wait_port() {
  local tries=$(( ${2:-10} * 10 ))
  for _ in $(seq "$tries"); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# tls_certificate CERT KEY [DAYS]: writes a self-signed ECDSA P-256 certificate for localhost
# (what issue 18's TLS scenarios name), valid for DAYS (default 30), to CERT and its key to KEY.
tls_certificate() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "${3:-30}" \
    -subj /CN=localhost -keyout "$2" -out "$1" 2>/dev/null
}

# Sets HARNESS, unless the caller already has, to the shared harness (../shared/bench from the
# repository's root, or /work/shared/bench); leaves it empty when neither is there.
find_harness() {
  [ -n "${HARNESS:-}" ] && return 0
  local h
  for h in ../shared/bench /work/shared/bench; do
    [ -d "$h" ] && HARNESS=$(cd "$h" && pwd) && return 0
  done
  HARNESS=
}

# Memcached servers of their own, straight or behind Toxiproxy, for the item-7 scripts
# (bench/shared_tier_latency.sh, bench/tier_fixed_rate.sh). The caller keeps PIDS, an array of
# the daemons to kill at its exit, to which each one started here is added; ON_CPU, an optional
# array, is put before each daemon's command (e.g. ON_CPU=(taskset -c 0)). They set variables
# instead of echoing: a daemon started inside $(...) would belong to that subshell.
#   start_toxiproxy DIR          builds bench/toxiproxy into DIR and starts it: TP, its API port
#   memcached_for                a new memcached: PORT
#   relayed NAME MICROS|none     a new memcached behind Toxiproxy, MICROS each way: PORT
start_toxiproxy() {
  (cd bench/toxiproxy && go build -o "$1/toxiproxy" .)
  TP=$(free_port)
  ${ON_CPU[@]+"${ON_CPU[@]}"} "$1/toxiproxy" -host 127.0.0.1 -port "$TP" 2>"$1/toxiproxy.log" &
  PIDS+=($!)
  wait_port "$TP" 5
}
toxi_post() { curl -sf -X POST "http://127.0.0.1:$TP$1" -d "$2" >/dev/null; }
memcached_for() {
  PORT=$(free_port)
  ${ON_CPU[@]+"${ON_CPU[@]}"} memcached -u nobody -l 127.0.0.1 -p "$PORT" -U 0 -m 256 -t 1 &
  PIDS+=($!)
  wait_port "$PORT" 5
}
relayed() {
  memcached_for
  local upstream=$PORT
  PORT=$(free_port)
  toxi_post /proxies "{\"name\":\"$1\",\"listen\":\"127.0.0.1:$PORT\",\"upstream\":\"127.0.0.1:$upstream\",\"enabled\":true}"
  if [ "$2" != none ]; then
    for stream in upstream downstream; do
      toxi_post "/proxies/$1/toxics" "{\"name\":\"$stream\",\"type\":\"latency_us\",\"stream\":\"$stream\",\"attributes\":{\"latency\":$2}}"
    done
  fi
  wait_port "$PORT" 5
}

# --cache-sim for the callgrind scripts: callgrind also simulates the caches and the branch
# predictor (valgrind's model of this CPU's I1/D1/LL), so that a change in code layout (a
# profile-guided or BOLT build) shows in a count as stable as the instructions, instead of only
# in wall-clock runs. SIM holds valgrind's options; empty without the flag.
SIM=()
# cache_sim_report DUMP REQUESTS: the simulated instruction-cache misses and mispredicted
# branches per request, from the dump's totals (nothing when SIM is empty)
cache_sim_report() {
  [ ${#SIM[@]} -gt 0 ] || return 0
  callgrind_annotate "$1" 2>/dev/null | awk -v n="$2" '
    /^Events shown:/ { for (i = 3; i <= NF; i++) ev[i - 2] = $i }
    /PROGRAM TOTALS/ {
      for (i = 1; i < NF; i++) { v = $i; gsub(",", "", v); if (v ~ /^[0-9]+$/) val[++k] = v }
      for (j = 1; j <= k; j++) got[ev[j]] = val[j]
      printf "  per request: I1 misses %.0f, LL instruction misses %.1f, D1 misses %.0f, mispredicted branches %.0f (conditional %.0f, indirect %.0f)\n",
        got["I1mr"] / n, got["ILmr"] / n, (got["D1mr"] + got["D1mw"]) / n, (got["Bcm"] + got["Bim"]) / n, got["Bcm"] / n, got["Bim"] / n
    }'
}
