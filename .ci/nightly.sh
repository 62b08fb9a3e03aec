#!/usr/bin/env bash
# Nightly and pre-release CI: what is too slow for every push. Five minutes of fuzzing what is
# read from memcached and from clients (scripts/fuzz.sh, which installs nightly and cargo-fuzz
# when missing); the profile-guided release build (scripts/build-pgo.sh, with its training load)
# and the Debian package made of it, installed and checked to serve a hit
# (packaging/build-deb.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fuzz.sh 300
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked
packaging/build-deb.sh
