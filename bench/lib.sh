# Helpers every bench script starts with; source it after `cd`-ing to the repository's root:
#   . bench/lib.sh

# A port nothing listens on now (the kernel's pick), on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

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
