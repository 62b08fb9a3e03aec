#!/usr/bin/env bash
# Installs what building and testing Lacquer needs on a fresh Debian machine:
# a C toolchain and cmake (Pingora builds zlib-ng), memcached (tests run real servers), curl,
# h2load (tests/protocols.rs loads the h2 listener the way a load generator does),
# Chromium (tests/status_page.rs loads the admin status page headless), and a Python virtualenv
# in .venv with the example page writer's memcached client (tests/app_pages.rs runs
# examples/python/lacquer_pages.py with it) and the Django test site's Django, gunicorn, Channels
# and uvicorn (tests/django_site.rs runs tests/django_site/ with them).
# Safe to run again: it installs only what is missing.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v cmake >/dev/null || need+=(cmake)
command -v memcached >/dev/null || [ -x /usr/bin/memcached ] || need+=(memcached)
command -v curl >/dev/null || need+=(curl)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v chromium >/dev/null || need+=(chromium)
command -v openssl >/dev/null || need+=(openssl)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
. "$(dirname "$0")/apt.sh"
apt_install "${need[@]}"
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (rustup) first" >&2; exit 1; }
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c 'import pymemcache, django, gunicorn, channels, uvicorn, websockets' 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install -q -r examples/python/requirements.txt -r tests/django_site/requirements.txt
fi
