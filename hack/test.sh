#!/usr/bin/env bash
# Runs the whole test suite as root: unit tests, and integration tests that
# drive the real binaries in throwaway network namespaces. Ends with a table
# of each phase's wall time (hack/lib/phases.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/phases.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/macvtap-test.XXXXXX")
on_exit() {
  local rc=$?
  set +e
  phase_table
  rm -rf "$work"
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

phase "set-up (hack/setup.sh)" hack/setup.sh
# A failing test prints its error and causes; anyhow adds a backtrace to
# them when RUST_BACKTRACE is set in the user's shell, and that backtrace
# says nothing the message does not. Panics keep theirs.
export RUST_LIB_BACKTRACE=0
# Each Go program a test builds on first use (test-support/src/gopeers.rs)
# adds its build time here; the tests' own output shows only on failure.
export MACVTAP_GO_PEER_TIMES=$work/go-peer-times
: >"$MACVTAP_GO_PEER_TIMES"

# The real-node test (e2e/tests/cluster.rs) runs alone, after the rest:
# its kubelet, containerd and Multus hold the node's fixed paths
# (/var/lib/kubelet, /opt/cni/bin, /etc/cni/net.d) and its tap nodes, which
# other tests would wait for past their deadlines.
status=0
phase "phase 1: every test but the real-node e2e (cargo nextest run)" \
  cargo nextest run --workspace --no-fail-fast -E 'not binary_id(macvtap-e2e::cluster)' "$@" || status=$?
if [[ -s $MACVTAP_GO_PEER_TIMES ]]; then
  while IFS=$'\t' read -r what secs; do
    phase_row 1 "Go, built by a test on first use: $what" "$secs" ""
  done <"$MACVTAP_GO_PEER_TIMES"
else
  phase_row 1 "Go, built by a test on first use: none (all cached, or none needed)" "" ""
fi

phase "phase 2: the real-node e2e (e2e/tests/cluster.rs)" \
  cargo nextest run --workspace --no-fail-fast -E 'binary_id(macvtap-e2e::cluster)' "$@" || status=$?
exit "$status"
