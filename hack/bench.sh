#!/usr/bin/env bash
# Runs every benchmark against its references in one interleaved run, prints
# the tables and writes BENCHMARKS.md and benchmarks.svg. Needs root.
#   hack/bench.sh                 # everything (BENCH_N=200 rounds by default)
#   BENCH_ONLY=cni,version hack/bench.sh
#   BENCH_ONLY=gocni,godp,sizes BENCH_IDLE_SECS=5 hack/bench.sh  # beside the Go project
#     (kubevirt/macvtap-cni v0.13.1 from hack/peers/; the Go module proxy does not serve it
#     today, so these fail saying so, and a full run reports its Go columns as not run)
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
echo "==> building the shipped (static) binaries and the bench"
hack/build-static.sh "" target/static >/dev/null
cargo build --release -q -p macvtap-e2e --bin macvtap-bench
exec "${CARGO_TARGET_DIR:-target}/release/macvtap-bench"
