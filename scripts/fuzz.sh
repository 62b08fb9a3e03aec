#!/usr/bin/env bash
# Fuzzes Lacquer's untrusted input (fuzz/: what it reads from memcached, the entry decoder and
# the manifest/chunk assembly; what a client sends, an HTTP/1 request head and body) for
# SECONDS of CPU time in all on two cores (default 60): the targets run side by side, each for
# half of SECONDS. Installs what it needs when missing: the nightly toolchain (cargo-fuzz needs
# it) and cargo-fuzz. New inputs go to a scratch directory; the committed seeds in fuzz/corpus/
# are read, never rewritten. A crash fails the script and leaves the input under fuzz/artifacts/.
#
#   scripts/fuzz.sh [SECONDS]
#   scripts/fuzz.sh --build-only    (installs and builds, runs nothing: CI builds beside the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=false
if [ "${1:-}" = "--build-only" ]; then
  build_only=true
  shift
fi
seconds="${1:-60}"
targets=(entry_decode chunk_assembly request_head)

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

# The vendored crates (vendor/) are path dependencies, whose lints cargo does not cap as it caps a
# registry crate's: under `--cfg fuzzing` h2 compiles its `fuzz_bridge`, which its own
# `deny(missing_docs)` refuses. Lints are clippy's job in .ci/run, not the fuzzers'.
export RUSTFLAGS="${RUSTFLAGS:-} --cap-lints warn"

# side by side, each for half of SECONDS: on two cores each target gets the CPU time it had when
# they ran in turn (a third of SECONDS), in half the wall-clock time
per_target=$(( seconds / 2 ))
[ "$per_target" -ge 1 ] || per_target=1
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# No AddressSanitizer: the code under test is safe Rust (an out-of-bounds slice panics, which the
# fuzzer reports). A debug build (`--dev`, debug assertions and overflow checks on): it runs
# slower than a release one, but builds in a fraction of the time, which is what a short run in
# CI needs.
# on a failure, the compiler's messages (the build's last lines are cargo-fuzz's backtrace)
if ! cargo +nightly fuzz build --dev --sanitizer none >"$scratch/build.log" 2>&1; then
  grep -v -E '^ +(Compiling|Checking) ' "$scratch/build.log" | head -n 80 >&2
  echo "fuzz: the targets did not build" >&2
  exit 1
fi
tail -n 2 "$scratch/build.log"
if "$build_only"; then
  echo "fuzz: targets built"
  exit 0
fi
pids=()
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target"
  echo "fuzz: $target for ${per_target}s"
  cargo +nightly fuzz run --dev --sanitizer none "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$per_target" -max_len=65536 -print_final_stats=1 >"$scratch/$target.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  status=0
  wait "${pids[$i]}" || status=$?
  grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|panicked|ERROR|SUMMARY|Test unit written" \
    "$scratch/$target.log" | sed "s/^/$target: /" || true
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$scratch/$target.log" >&2
    echo "fuzz: $target failed (exit $status); the input is under fuzz/artifacts/$target/" >&2
    failed=$status
  fi
done
[ "$failed" -eq 0 ] || exit "$failed"
echo "fuzz: no crash in ${per_target}s of each target, side by side"
