#!/usr/bin/env bash
# Runs every benchmark against its references in one interleaved run, prints
# the tables and writes BENCHMARKS.md and benchmarks.svg. Needs root.
#   hack/bench.sh                 # everything (BENCH_N=200 rounds by default)
#   BENCH_ONLY=cni,version hack/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
echo "==> building the shipped (static) binaries and the bench"
hack/build-static.sh "" target/static >/dev/null
cargo build --release -q -p macvtap-e2e --bin macvtap-bench
exec target/release/macvtap-bench
