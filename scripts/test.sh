#!/usr/bin/env bash
# Installs the test dependencies (real memcached, cmake, a C compiler) and runs the whole suite.
# Integration tests start real origins, real memcached processes and the real lacquer binary
# on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Four tests at a time in each test binary (the default is one per core): the integration tests
# spend their time waiting on sockets, child processes and timers, not on the CPU. On CI's two
# cores this takes the run from about 310 s to 225 s. RUST_TEST_THREADS overrides it.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
cargo test --workspace --all-targets "$@"
