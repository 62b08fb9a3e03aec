#!/usr/bin/env bash
# Builds the Debian package and checks it: the .deb installs, and the installed binary, started
# as `lacquer --config /etc/lacquer/lacquer.toml` (no systemd), serves a cache hit.
#
#   packaging/build-deb.sh            build target/debian/lacquer_*.deb, then check it
#   packaging/build-deb.sh --no-pgo   ... with the plain release build of the proxy
#   packaging/build-deb.sh --no-build check the .deb already built
#
# The proxy packaged is the profile-guided build laid out by BOLT (scripts/build-pgo.sh: two
# release builds and two minutes of training load; docs/benchmarks.md has what it gains), unless
# --no-pgo.
#
# How it checks the install: with a Docker daemon, `apt-get install ./lacquer_*.deb` in a fresh
# debian:bookworm-slim container (the maintainer script, the user, the unit, the config), then
# the hit inside it. Without one, `dpkg --dry-run -i` (dependencies resolve here), and the package
# unpacked into a scratch root with `dpkg-deb -x`, whose binary and config serve the hit; it never
# installs on the machine it runs on.
#
# A release build with LTO takes minutes: CI runs this nightly and before a release
# (.ci/nightly.sh), not on every push. Needs cargo-deb (`cargo install cargo-deb`).
set -euo pipefail
cd "$(dirname "$0")/.."

pgo=true
[ "${1:-}" = "--no-pgo" ] && pgo=false
if [ "${1:-}" != "--no-build" ]; then
  command -v cargo-deb >/dev/null || { echo "build-deb: cargo-deb missing (cargo install cargo-deb)" >&2; exit 1; }
  cargo build --release --locked --bin lacquer --bin lacquer-man
  mkdir -p target/man
  target/release/lacquer-man | gzip -9n > target/man/lacquer.1.gz
  if "$pgo"; then
    scripts/build-pgo.sh
    cp target/pgo/lacquer target/release/lacquer
  fi
  cargo deb --no-build --strip -p lacquer
  if "$pgo"; then
    # cargo's own output again at the next `cargo build --release`, not the one packaged
    rm target/release/lacquer
  fi
fi
deb=$(ls -t target/debian/lacquer_*.deb | head -1)
echo "build-deb: checking $deb"

# the package's shape
contents=$(dpkg-deb -c "$deb")
for path in ./usr/bin/lacquer ./etc/lacquer/lacquer.toml ./usr/share/man/man1/lacquer.1.gz \
            ./usr/lib/systemd/system/lacquer.service; do
  grep -q " $path\$" <<<"$contents" || { echo "build-deb: $path missing from $deb" >&2; exit 1; }
done
dpkg-deb -f "$deb" Depends | grep -q adduser
dpkg-deb -e "$deb" "$(mktemp -d)" >/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# serve_hit LACQUER CONFIG: starts an origin and LACQUER --config CONFIG (rewritten to listen on
# free ports), asks twice for a page, and wants the second answer to be a hit.
serve_hit() {
  local lacquer=$1 config=$2 work origin_port port origin_pid pid status
  work=$(mktemp -d)
  origin_port=$(free_port); port=$(free_port)
  mkdir -p "$work/www" && echo "a page" > "$work/www/page.html"
  # an old Last-Modified: heuristic freshness (a day at most) makes the page cacheable
  touch -d '2020-01-01' "$work/www/page.html"
  (cd "$work/www" && exec python3 -m http.server "$origin_port" --bind 127.0.0.1) >/dev/null 2>&1 &
  origin_pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$origin_port/" && break; sleep 0.1; done
  sed -e "s|^upstream = .*|upstream = \"127.0.0.1:$origin_port\"|" \
      -e "s|^upgrade_sock = .*|upgrade_sock = \"$work/upgrade.sock\"|" "$config" > "$work/lacquer.toml"
  printf 'listen = ["127.0.0.1:%s"]\n%s\n' "$port" "$(cat "$work/lacquer.toml")" > "$work/lacquer.toml.new"
  mv "$work/lacquer.toml.new" "$work/lacquer.toml"
  "$lacquer" --config "$work/lacquer.toml" >"$work/out.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
  curl -s -o /dev/null "http://127.0.0.1:$port/page.html"
  status=$(curl -s -D - -o /dev/null "http://127.0.0.1:$port/page.html" | tr -d '\r' | grep -i '^cache-status:' || true)
  kill -TERM "$pid"; wait "$pid" || true
  kill "$origin_pid"; wait "$origin_pid" 2>/dev/null || true
  if ! grep -q '; hit' <<<"$status"; then
    echo "build-deb: no hit from the packaged lacquer ($status); its log:" >&2
    cat "$work/out.log" >&2
    return 1
  fi
  echo "build-deb: packaged lacquer served a hit ($status)"
}

if docker info >/dev/null 2>&1; then
  docker run --rm -v "$PWD/$deb:/tmp/lacquer.deb:ro" -v "$PWD/packaging/build-deb.sh:/check.sh:ro" \
    debian:bookworm-slim sh -c '
      set -e
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q /tmp/lacquer.deb curl python3 >/dev/null
      getent passwd lacquer >/dev/null
      test -f /usr/lib/systemd/system/lacquer.service
      lacquer --check-config /etc/lacquer/lacquer.toml
      LACQUER_INSTALLED=1 bash /check.sh --no-build'
  exit 0
fi

if [ "${LACQUER_INSTALLED:-}" = 1 ]; then
  # inside the container above: the package is installed for real
  serve_hit /usr/bin/lacquer /etc/lacquer/lacquer.toml
  exit 0
fi

echo "build-deb: no Docker daemon; dry-run install here and serve from the unpacked package"
dpkg --dry-run -i "$deb" >/dev/null
root=$(mktemp -d)
dpkg-deb -x "$deb" "$root"
"$root/usr/bin/lacquer" --check-config "$root/etc/lacquer/lacquer.toml"
serve_hit "$root/usr/bin/lacquer" "$root/etc/lacquer/lacquer.toml"
