#!/usr/bin/env bash
# Runs the whole test suite as root: unit tests, and integration tests that
# drive the real binaries in throwaway network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# A failing test prints its error and causes; anyhow adds a backtrace to
# them when RUST_BACKTRACE is set in the user's shell, and that backtrace
# says nothing the message does not. Panics keep theirs.
export RUST_LIB_BACKTRACE=0
cargo nextest run --workspace --no-fail-fast "$@"
