#!/usr/bin/env bash
# Builds statically linked release binaries of the device plugin and the CNI
# into OUT_DIR (default target/static). TARGET defaults to musl when its
# standard library is installed, else glibc with a static C runtime. Cargo's
# output is read from $CARGO_TARGET_DIR when it is set, as cargo writes it.
#   hack/build-static.sh [TARGET] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-}
out=${2:-target/static}
if [ -z "$target" ]; then
  if rustup target list --installed 2>/dev/null | grep -x x86_64-unknown-linux-musl >/dev/null; then
    target=x86_64-unknown-linux-musl
  else
    target=x86_64-unknown-linux-gnu
  fi
fi
# An explicit --target keeps build scripts and proc macros dynamic.
# Source paths in the binaries (panic locations) name the repository and the
# crates as /macvtap-rs/... and /cargo/..., never this machine's directories.
cargo_home=${CARGO_HOME:-${HOME:-/root}/.cargo}
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static --remap-path-prefix=$PWD=/macvtap-rs --remap-path-prefix=$cargo_home=/cargo" \
  cargo build --release --locked --target "$target" -p macvtap-cni -p macvtap-deviceplugin
mkdir -p "$out"
for b in macvtap macvtap-deviceplugin; do
  cp "${CARGO_TARGET_DIR:-target}/$target/release/$b" "$out/$b"
done
echo "static binaries ($target) in $out:"
ls -l "$out/macvtap" "$out/macvtap-deviceplugin"
