#!/usr/bin/env bash
# Installs the test dependencies (real memcached, cmake, a C compiler) and runs the whole suite.
# Integration tests start real origins, real memcached processes and the real lacquer binary
# on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --all-targets "$@"
