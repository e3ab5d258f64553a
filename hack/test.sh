#!/usr/bin/env bash
# Runs the whole test suite as root: unit tests, and integration tests that
# drive the real binaries in throwaway network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
cargo nextest run --workspace --no-fail-fast "$@"
