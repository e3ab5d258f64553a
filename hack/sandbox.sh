#!/usr/bin/env bash
# The main job on one machine: a throwaway sandbox node where the macvtap CNI
# hands a macvtap link over to a "pod" exactly as Multus runs it (ADD, CHECK,
# DEL), and the pod pings a peer on the NIC's segment through it. Everything
# lives in network namespaces named mvt-sbx-* and is removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
echo "==> building (release)"
cargo build --release -q -p macvtap-cni -p macvtap-link --examples --bins
CNI=$PWD/target/release/macvtap

NODE=mvt-sbx-node POD=mvt-sbx-pod PEER=mvt-sbx-peer
cleanup() { for ns in $POD $NODE $PEER; do ip netns del "$ns" 2>/dev/null || true; done; }
trap cleanup EXIT
cleanup

step() { printf '\n==> %s\n' "$*"; }
cni() { # cni COMMAND CONFIG
  env -i PATH="$PATH" CNI_COMMAND="$1" CNI_CONTAINERID=sandbox-pod CNI_NETNS=/run/netns/$POD \
    CNI_IFNAME=net1 CNI_PATH=/usr/lib/cni \
    CNI_ARGS="IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=vm-demo;MAC=02:00:c0:00:02:02" \
    ip netns exec $NODE "$CNI" <<<"$2"
}

step "sandbox node: netns $NODE, NIC lower0 (a veth); a peer host in $PEER at 192.0.2.1/24"
for ns in $NODE $POD $PEER; do ip netns add "$ns"; done
ip -n $NODE link add lower0 type veth peer name peer0 netns $PEER
ip -n $NODE link set lower0 up
ip -n $PEER addr add 192.0.2.1/24 dev peer0
ip -n $PEER link set peer0 up

DEVICE=dataplaneMvp0
LINK=$(target/release/examples/link-name $DEVICE)
step "device plugin's part (Allocate): macvtap $LINK for device $DEVICE on lower0"
ip -n $NODE link add "$LINK" link lower0 type macvtap mode bridge
IDX=$(ip netns exec $NODE cat /sys/class/net/"$LINK"/ifindex)
echo "    created $LINK, ifindex $IDX, char device /dev/tap$IDX ($(stat -c '%U:%G' /dev/tap"$IDX"))"

CONF='{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap","mtu":1500,"deviceID":"'$DEVICE'",
 "ipam":{"type":"static","addresses":[{"address":"192.0.2.2/24"}]}}'
step "CNI ADD (as Multus runs it, with deviceID injected) into pod netns $POD as net1"
RESULT=$(cni ADD "$CONF")
echo "    result: $RESULT"
echo "    in the pod: $(ip -n $POD -br link show net1)"
echo "    /dev/tap$IDX is now $(stat -c '%u:%g' /dev/tap"$IDX") (the VM user, 107:107)"
ip -n $NODE link show "$LINK" >/dev/null 2>&1 && { echo "BUG: link still on the host"; exit 1; }

step "the pod reaches the peer through the macvtap"
ip netns exec $POD ping -c 2 -W 2 192.0.2.1 | sed 's/^/    /'

step "CNI CHECK"
CHECK_CONF=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); c["prevResult"]=json.loads(sys.argv[2]); print(json.dumps(c))' "$CONF" "$RESULT")
cni CHECK "$CHECK_CONF" && echo "    ok: net1 is a macvtap, up, with the MAC, MTU and address of the result"

step "CNI DEL (twice: DEL is idempotent)"
cni DEL "$CONF" && cni DEL "$CONF" && echo "    ok"
echo "    pod links now: $(ip -n $POD -br link | awk '{print $1}' | tr '\n' ' ')"
[ -e /dev/tap"$IDX" ] && { echo "BUG: /dev/tap$IDX left behind"; exit 1; }
echo "    /dev/tap$IDX is gone with its link"

step "a pod without the resource (no deviceID) gets a clear error"
cni ADD '{"cniVersion":"1.0.0","name":"dataplane","type":"macvtap"}' 2>/dev/null | sed 's/^/    /' || true

step "done; removing the sandbox namespaces"
