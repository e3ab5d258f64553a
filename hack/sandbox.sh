#!/usr/bin/env bash
# The main job on one machine: a throwaway sandbox node where the real device
# plugin registers with a test kubelet, a device is allocated as for a VM
# pod, the real Multus (v4.2.2, built once from its pinned module in
# hack/peers/ with the machine's Go) runs our CNI, a VM boots on the macvtap (QEMU, TCG, as
# uid 107) and pings a peer host, and everything is cleaned up. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
echo "==> building (release)"
cargo build --release -q -p macvtap-cni -p macvtap-deviceplugin -p macvtap-e2e --bins
exec "${CARGO_TARGET_DIR:-target}/release/macvtap-sandbox"
