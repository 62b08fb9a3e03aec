#!/usr/bin/env bash
# Keeps the vendored crates (Pingora's, TinyUFO, h2) honest: each vendor/<crate> must be the
# published crate (every file, byte for byte) plus the patches in vendor/patches/<crate>/, applied
# in name order. An edit to a copy that no patch records fails the check, so a copy cannot drift
# from its patches.
# It also checks that the product's and the fuzzers' workspaces both patch each crate to its copy.
# .ci/run runs it before the tests.
#
#   scripts/check-vendor.sh                       check every vendored crate; on a difference,
#                                                 print it and exit 1
#   scripts/check-vendor.sh --regenerate [CRATE]  rewrite vendor/CRATE (default: all) as the
#                                                 published crate + its patches
#   scripts/check-vendor.sh --diff CRATE          print what vendor/CRATE changes beyond the
#                                                 published crate + its patches: a change to
#                                                 record as the crate's next patch
#
# The published crates are read from cargo's download cache; if one is not there, cargo (the
# registry's own client) fetches it. Its sha256 must equal the one in VENDORED below, the checksum
# Cargo.lock recorded for it before `[patch.crates-io]` replaced it, and Cargo.lock's own checksum
# if it has one again. Needs only cargo, git, tar and coreutils.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

# name version sha256 of the published .crate
VENDORED=(
  "pingora-proxy 0.9.1 8e3d5670490740405ecc8c6f75c3fcbce4d24f7adaffb355ca44550e7918e358"
  "pingora-core 0.9.1 a535f47f65fdcb003f9e1df04cd18e614c128dfe9388acce3f211ae38ac14d68"
  "TinyUFO 0.9.1 72518a72324e6fefaa2d456e4ac4ff950c02f12e885e1ff5aab32c8549fc518d"
  "pingora-http 0.9.1 3f38e9e519d53fab09eb320f7be2cd27ef9e66f755eba3bd84cc68852108d841"
  "h2 0.4.20 7d29020232d6aa3fb1daca64c1127cf662cf97f254ae16c18c05b8ab635fc118"
)

usage() { sed -n '8,15s/^# \{1,3\}//p' "$0" >&2; exit 2; }
mode=check
only=
case "${1:-}" in
  "" | --check) ;;
  --regenerate) mode=regenerate; only=${2:-} ;;
  --diff) mode="diff"; only=${2:-}; [ -n "$only" ] || usage ;;
  *) usage ;;
esac
[ $# -le 2 ] || usage
if [ -n "$only" ] && ! printf '%s\n' "${VENDORED[@]}" | grep -q "^$only "; then
  echo "check-vendor: $only is not a vendored crate" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Prints the path of a cached $1-$2.crate whose sha256 is $3.
cached_crate() {
  local file
  for file in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$1-$2.crate"; do
    [ -f "$file" ] && [ "$(sha256_of "$file")" = "$3" ] && { echo "$file"; return 0; }
  done
  return 1
}

# Has cargo download crate $1 version $2 into its cache (cargo checks it against the registry
# index), from a throwaway package that depends on it alone. With the project's Cargo.lock, the
# crates that come down with it are the versions the build would download anyway.
fetch_crate() {
  local fetcher=$work/fetcher-$1
  mkdir -p "$fetcher/src"
  : >"$fetcher/src/lib.rs"
  cat >"$fetcher/Cargo.toml" <<EOF
[package]
name = "vendor-check-fetcher"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$1 = "=$2"

[workspace]
EOF
  cp Cargo.lock "$fetcher/"
  cargo fetch --quiet --manifest-path "$fetcher/Cargo.toml" \
    --target "$(rustc -vV | sed -n 's/^host: //p')"
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

# Checks, regenerates or diffs one vendored crate: $1 name, $2 version, $3 sha256.
vendor_one() {
  local crate=$1 version=$2 crate_sha256=$3
  local copy=vendor/$crate patches=vendor/patches/$crate

  # Cargo.lock keeps a checksum for the crate only while it comes from the registry.
  local lock_sha256
  lock_sha256=$(awk -v name="name = \"$crate\"" -v version="version = \"$version\"" '
    /^\[\[package\]\]$/ { in_name = 0; in_version = 0 }
    $0 == name { in_name = 1 }
    $0 == version { in_version = 1 }
    in_name && in_version && /^checksum = / { gsub(/^checksum = "|"$/, ""); print; exit }
  ' Cargo.lock)
  if [ -n "$lock_sha256" ] && [ "$lock_sha256" != "$crate_sha256" ]; then
    echo "check-vendor: Cargo.lock says $crate $version has sha256 $lock_sha256," \
      "this script says $crate_sha256" >&2
    return 1
  fi

  local crate_file
  crate_file=$(cached_crate "$crate" "$version" "$crate_sha256") ||
    { fetch_crate "$crate" "$version" &&
      crate_file=$(cached_crate "$crate" "$version" "$crate_sha256"); } || {
    echo "check-vendor: no $crate-$version.crate with sha256 $crate_sha256 in cargo's cache" \
      "after cargo fetch; found:" >&2
    for file in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$crate-$version.crate"; do
      [ -f "$file" ] && echo "  $file  sha256 $(sha256_of "$file")" >&2
    done
    return 1
  }

  rm -rf "$work/$crate-$version" "$work/expected"
  tar -xzf "$crate_file" -C "$work" --no-same-owner
  local published=$work/$crate-$version

  # The published crate with the patches applied: what the vendored copy must be.
  local expected=$work/expected patch
  cp -R "$published" "$expected"
  for patch in "$patches"/*.patch; do
    [ -f "$patch" ] || continue
    # GIT_CEILING_DIRECTORIES: apply as a plain patch even if $work sits inside some repository
    if ! (cd "$expected" && GIT_CEILING_DIRECTORIES=$work git apply -p1 "$repo/$patch"); then
      echo "check-vendor: $patch does not apply to the published $crate $version" \
        "(plus the patches before it)" >&2
      return 1
    fi
  done

  if [ "$mode" = diff ]; then
    diff_trees "$expected" "$copy" || [ $? -eq 1 ]
    return 0
  fi

  if [ "$mode" = regenerate ]; then
    rm -rf "$copy"
    cp -R "$expected" "$copy"
    echo "check-vendor: $copy rewritten as the published $crate $version + $patches/*.patch"
    return 0
  fi

  if ! diff_trees "$expected" "$copy" >"$work/difference"; then
    cat "$work/difference" >&2
    cat >&2 <<EOF

check-vendor: $copy is not the published $crate $version plus $patches/*.patch
(diff above: a/ is what it should be, b/ is what it is). Either undo the edit
(scripts/check-vendor.sh --regenerate $crate) or record it in a patch under $patches/
(scripts/check-vendor.sh --diff $crate prints the unrecorded change; see vendor/README.md).
EOF
    return 1
  fi
  local patch_count
  patch_count=$(find "$patches" -name '*.patch' 2>/dev/null | wc -l)
  echo "check-vendor: $copy is the published $crate $version" \
    "(sha256 ${crate_sha256:0:12}...) plus $patch_count patch(es), file for file"
}

status=0
for entry in "${VENDORED[@]}"; do
  read -r crate version sha256 <<<"$entry"
  [ -z "$only" ] || [ "$only" = "$crate" ] || continue
  vendor_one "$crate" "$version" "$sha256" || status=1
  # every workspace that builds Lacquer must use the copy: the product's and the fuzzers' own
  for manifest in Cargo.toml fuzz/Cargo.toml; do
    if ! grep -q "^$crate = { path = \"\(\.\./\)\?vendor/$crate\" }" "$manifest"; then
      echo "check-vendor: $manifest's [patch.crates-io] does not point $crate at vendor/$crate" >&2
      status=1
    fi
  done
done
exit $status
