#!/usr/bin/env bash
# Installs what building and testing Lacquer needs on a fresh Debian machine:
# a C toolchain and cmake (Pingora builds zlib-ng), memcached (tests run real servers), curl,
# and the Django test site's virtualenv (tests/django_site/.venv: Django and gunicorn).
# Safe to run again: it installs only what is missing.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v cmake >/dev/null || need+=(cmake)
command -v memcached >/dev/null || [ -x /usr/bin/memcached ] || need+=(memcached)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  # keep package post-install scripts from starting services (memcached would grab 11211)
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
  fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (rustup) first" >&2; exit 1; }

# the Django site the suite runs behind Lacquer (tests/django_site.rs)
site="$(dirname "$0")/../tests/django_site"
if [ ! -x "$site/.venv/bin/gunicorn" ] || ! "$site/.venv/bin/python" -c 'import django' 2>/dev/null; then
  python3 -m venv "$site/.venv"
  "$site/.venv/bin/pip" install -q --disable-pip-version-check -r "$site/requirements.txt"
fi
