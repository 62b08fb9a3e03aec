#!/usr/bin/env bash
# Keeps the vendored pingora-proxy honest: vendor/pingora-proxy must be the published crate
# (every file, byte for byte) plus the patches in vendor/patches/, applied in name order. An edit
# to the copy that no patch records fails the check, so the copy cannot drift from its patch.
# .ci/run runs it before the tests.
#
#   scripts/check-vendor.sh               check; on a difference, print it and exit 1
#   scripts/check-vendor.sh --regenerate  rewrite vendor/pingora-proxy as published crate + patches
#   scripts/check-vendor.sh --diff        print the whole published crate -> vendor/pingora-proxy
#                                         diff, to record a deliberate change as a patch
#
# The published crate is read from cargo's download cache; if it is not there, cargo (the
# registry's own client) fetches it. Its sha256 must equal CRATE_SHA256 below, the checksum
# Cargo.lock recorded for pingora-proxy 0.9.1 before `[patch.crates-io]` replaced it, and
# Cargo.lock's own checksum if it has one again. Needs only cargo, git, tar and coreutils.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

CRATE=pingora-proxy
VERSION=0.9.1
CRATE_SHA256=8e3d5670490740405ecc8c6f75c3fcbce4d24f7adaffb355ca44550e7918e358
VENDORED=vendor/$CRATE
PATCHES=vendor/patches

usage() { sed -n '7,10s/^# \{1,3\}//p' "$0" >&2; exit 2; }
mode=check
case "${1:-}" in
  "" | --check) ;;
  --regenerate) mode=regenerate ;;
  --diff) mode=diff ;;
  *) usage ;;
esac
[ $# -le 1 ] || usage

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Cargo.lock keeps a checksum for the crate only while it comes from the registry.
lock_sha256=$(awk -v name="name = \"$CRATE\"" -v version="version = \"$VERSION\"" '
  /^\[\[package\]\]$/ { in_name = 0; in_version = 0 }
  $0 == name { in_name = 1 }
  $0 == version { in_version = 1 }
  in_name && in_version && /^checksum = / { gsub(/^checksum = "|"$/, ""); print; exit }
' Cargo.lock)
if [ -n "$lock_sha256" ] && [ "$lock_sha256" != "$CRATE_SHA256" ]; then
  echo "check-vendor: Cargo.lock says $CRATE $VERSION has sha256 $lock_sha256," \
    "this script says $CRATE_SHA256" >&2
  exit 1
fi

# Prints the path of a cached $CRATE-$VERSION.crate whose sha256 is CRATE_SHA256.
cached_crate() {
  local file
  for file in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$CRATE-$VERSION.crate"; do
    [ -f "$file" ] && [ "$(sha256_of "$file")" = "$CRATE_SHA256" ] && { echo "$file"; return 0; }
  done
  return 1
}

# Has cargo download the crate into its cache (cargo checks it against the registry index), from
# a throwaway package that depends on it alone. With the project's Cargo.lock, the crates that come
# down with it are the versions the build would download anyway.
fetch_crate() {
  local fetcher=$work/fetcher
  mkdir -p "$fetcher/src"
  : >"$fetcher/src/lib.rs"
  cat >"$fetcher/Cargo.toml" <<EOF
[package]
name = "vendor-check-fetcher"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$CRATE = "=$VERSION"

[workspace]
EOF
  cp Cargo.lock "$fetcher/"
  cargo fetch --quiet --manifest-path "$fetcher/Cargo.toml" \
    --target "$(rustc -vV | sed -n 's/^host: //p')"
}

crate_file=$(cached_crate) || { fetch_crate && crate_file=$(cached_crate); } || {
  echo "check-vendor: no $CRATE-$VERSION.crate with sha256 $CRATE_SHA256 in cargo's cache" \
    "after cargo fetch; found:" >&2
  for file in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$CRATE-$VERSION.crate"; do
    [ -f "$file" ] && echo "  $file  sha256 $(sha256_of "$file")" >&2
  done
  exit 1
}

# Diffs two trees as git would, with paths that read a/src/lib.rs and b/src/lib.rs (so the
# output is a patch for `git apply -p1`); exits 1 when they differ.
diff_trees() {
  local old=$1 new=$2
  shift 2
  rm -rf "$work/a" "$work/b"
  cp -R "$old" "$work/a"
  cp -R "$new" "$work/b"
  (cd "$work" && git diff --no-index --no-color --no-ext-diff --no-textconv --no-prefix "$@" a b)
}

tar -xzf "$crate_file" -C "$work" --no-same-owner
published=$work/$CRATE-$VERSION

if [ "$mode" = diff ]; then
  diff_trees "$published" "$VENDORED" || [ $? -eq 1 ]
  exit 0
fi

# The published crate with the patches applied: what the vendored copy must be.
expected=$work/expected
cp -R "$published" "$expected"
for patch in "$PATCHES"/*.patch; do
  [ -f "$patch" ] || continue
  # GIT_CEILING_DIRECTORIES: apply as a plain patch even if $work sits inside some repository
  if ! (cd "$expected" && GIT_CEILING_DIRECTORIES=$work git apply -p1 "$repo/$patch"); then
    echo "check-vendor: $patch does not apply to the published $CRATE $VERSION" >&2
    exit 1
  fi
done

if [ "$mode" = regenerate ]; then
  rm -rf "$VENDORED"
  cp -R "$expected" "$VENDORED"
  echo "check-vendor: $VENDORED rewritten as the published $CRATE $VERSION + $PATCHES/*.patch"
  exit 0
fi

if ! diff_trees "$expected" "$VENDORED" >"$work/difference"; then
  cat "$work/difference" >&2
  cat >&2 <<EOF

check-vendor: $VENDORED is not the published $CRATE $VERSION plus $PATCHES/*.patch
(diff above: a/ is what it should be, b/ is what it is). Either undo the edit
(scripts/check-vendor.sh --regenerate) or record it in a patch under $PATCHES/
(scripts/check-vendor.sh --diff prints the whole change; see vendor/README.md).
EOF
  exit 1
fi
patch_count=$(find "$PATCHES" -name '*.patch' | wc -l)
echo "check-vendor: $VENDORED is the published $CRATE $VERSION" \
  "(sha256 ${CRATE_SHA256:0:12}...) plus $patch_count patch(es), file for file"
