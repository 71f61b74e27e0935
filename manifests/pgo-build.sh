#!/usr/bin/env bash
# Builds the injector the image ships: profile-guided (PGO). An instrumented build serves the load harness's
# reviews (new and repeated pods, mutating and validating, 2 KB to 60 KB and the corpus, HTTP/1.1 and HTTP/2, one
# request at a time and many), and the profile it records guides the final build: the code a review runs laid out
# together, the rest out of its way. At the API server's pace (one call at a time, the caches cold between calls)
# that takes 12-25% off our CPU per call (docs/performance.md, "Profile-guided build: the image's").
#
#   manifests/pgo-build.sh [--profile dist|release] [--out FILE] [--work DIR]
#
# --profile: cargo's profile of both builds (dist, the image's, unless told); --out: where the binary is copied
# (default: DIR/sidecar-injector); --work: the builds' own target directories and the profile (default: target/pgo).
# Needs rustup's llvm-tools (added if missing: llvm-profdata must be the LLVM rustc is built with). Exit 1 when a
# build or the training fails (the harness checks every answer), 2 on bad usage.
set -euo pipefail

cd "$(dirname "$0")/.."
fail() {
  echo "pgo-build.sh: $1" >&2
  exit 1
}
profile=dist
out=""
work=target/pgo
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    --work) work=${2:?--work needs a directory}; shift 2 ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pgo-build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-$work/sidecar-injector}
mkdir -p "$work"
work=$(cd "$work" && pwd)

# Built for the host named as a target, so that the flags below reach our binary and not build scripts or proc
# macros (cargo applies RUSTFLAGS to those only without --target).
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  rustup component add llvm-tools >&2 || fail "cannot add rustup's llvm-tools"
fi
# cargo's directory for the profile: `dev` builds into `debug`.
dir=$profile
[ "$profile" = dev ] && dir=debug

build() { # build TARGET_DIR RUSTFLAGS...
  local target_dir=$1
  shift
  RUSTFLAGS="${RUSTFLAGS:-} $*" cargo build --locked --profile "$profile" --target "$host" \
    --target-dir "$target_dir" --package sidecar-injector --bin sidecar-injector
}

echo "== pgo-build.sh: the load harness (the training's client)" >&2
cargo build --locked --release --package loadtest || fail "the load harness did not build"
loadtest="${CARGO_TARGET_DIR:-target}/release/loadtest"

echo "== pgo-build.sh: the instrumented build ($profile)" >&2
profiles="$work/profiles"
rm -rf "$profiles"
build "$work/instrumented" "-Cprofile-generate=$profiles" || fail "the instrumented build failed"
instrumented="$work/instrumented/$host/$dir/sidecar-injector"

echo "== pgo-build.sh: training (each run checks every answer)" >&2
log="$work/training.log"
: >"$log"
train() {
  if ! "$loadtest" --start --server-bin "$instrumented" --no-pin --warmup 0s --duration 2s "$@" >>"$log" 2>&1; then
    tail -n 40 "$log" >&2
    fail "training with $* failed (the harness's report above, all of it in $log)"
  fi
}
train --bodies 2k -c 1
train --bodies 2k -c 1 --webhook validate
train --bodies 2k -c 1 --generate-name
train --bodies 8k -c 4
train --bodies 8k -c 4 --webhook validate
train --bodies 60k -c 2
train --bodies corpus -c 1
train --bodies corpus -c 8 --http2
ls "$profiles"/*.profraw >/dev/null 2>&1 || fail "the training wrote no profile"
"$profdata" merge -o "$work/merged.profdata" "$profiles" || fail "llvm-profdata could not merge the profile"

echo "== pgo-build.sh: the optimized build ($profile)" >&2
build "$work/optimized" "-Cprofile-use=$work/merged.profdata" || fail "the profile-guided build failed"
mkdir -p "$(dirname "$out")"
cp "$work/optimized/$host/$dir/sidecar-injector" "$out"
echo "$out"
