#!/usr/bin/env bash
# Runs the whole test suite as root: unit tests, and integration tests that
# drive the real binaries in throwaway network namespaces. Ends with a table
# of each phase's wall time (hack/lib/phases.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/phases.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/macvtap-test.XXXXXX")
go_pid=
on_exit() {
  local rc=$?
  set +e
  # A build still running when this script stops (an error, Ctrl-C) stops
  # with it: it runs in a process group of its own.
  if [[ -n $go_pid ]] && kill -0 "$go_pid" 2>/dev/null; then
    kill -TERM -- "-$go_pid" 2>/dev/null
    wait "$go_pid" 2>/dev/null
  fi
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

# The real node's Go programs (Kubernetes, etcd, containerd, the CNI
# plugins, Multus thick: minutes with a cold Go cache, under a second warm)
# are built beside phase 1, which needs none of them, by `hack/cluster.sh
# build` at the lowest CPU priority (its `go build` runs at nice 19 anyway),
# so that phase 1's tests keep their deadlines. Only for the whole suite: a
# run of a subset (arguments) leaves them to the real-node test, if it is
# among them, which builds what is missing. hack/cluster.sh takes a lock
# per program, so another build of them (a user's `up`) waits for this one.
build_real_node_peers() {
  local t=$EPOCHREALTIME rc=0
  nice -n 19 hack/cluster.sh build </dev/null >"$work/go-build.log" 2>&1 || rc=$?
  phase_since "$t" >"$work/go-build.secs"
  return "$rc"
}
if (( $# == 0 )); then
  set -m # its own process group, which on_exit can stop as a whole
  build_real_node_peers &
  go_pid=$!
  set +m
fi

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

go_ok=1
if [[ -n $go_pid ]]; then
  t=$EPOCHREALTIME go_rc=0
  wait "$go_pid" || go_rc=$?
  go_pid=
  phase_row 0 "the real node's Go programs (hack/cluster.sh build, beside phase 1, nice 19)" \
    "$(cat "$work/go-build.secs" 2>/dev/null)" \
    "$(if (( go_rc == 0 )); then echo ok; else echo "failed (exit $go_rc)"; fi)"
  # hack/cluster.sh says "NAME: done in N s" after each program it built
  # or found.
  sed -n 's/^\[ *[0-9.]*s\] \(.*\): done in \([0-9.]*\) s$/\1\t\2/p' "$work/go-build.log" |
    while IFS=$'\t' read -r what secs; do phase_row 1 "$what" "$secs" ""; done
  phase_row 0 "waiting for them after phase 1" "$(phase_since "$t")" ""
  if (( go_rc != 0 )); then
    go_ok=0
    (( status )) || status=1
    {
      echo "hack/test.sh: building the real node's Go programs (hack/cluster.sh build) failed (exit $go_rc), so the real-node e2e is not run; its output:"
      sed 's/^/    /' "$work/go-build.log"
    } >&2
  fi
fi

if (( go_ok )); then
  phase "phase 2: the real-node e2e (e2e/tests/cluster.rs)" \
    cargo nextest run --workspace --no-fail-fast -E 'binary_id(macvtap-e2e::cluster)' "$@" || status=$?
else
  phase_row 0 "phase 2: the real-node e2e (e2e/tests/cluster.rs)" "" "not run: its Go programs did not build"
fi
exit "$status"
