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
# The real-node test (e2e/tests/cluster.rs) runs alone, after the rest:
# its kubelet, containerd and Multus hold the node's fixed paths
# (/var/lib/kubelet, /opt/cni/bin, /etc/cni/net.d) and its tap nodes, which
# other tests would wait for past their deadlines.
status=0
cargo nextest run --workspace --no-fail-fast -E 'not binary_id(macvtap-e2e::cluster)' "$@" || status=$?
cargo nextest run --workspace --no-fail-fast -E 'binary_id(macvtap-e2e::cluster)' "$@" || status=$?
exit "$status"
