#!/usr/bin/env bash
# Brings up a workstation cluster for the cluster e2e: kind, Multus, KubeVirt
# (software emulation, so no nested virtualisation is needed) and this
# project's image loaded into the nodes, then runs the cluster e2e on it.
# Needs docker (or podman) with a running engine, kind and kubectl, and
# internet access. The cluster e2e is #[ignore]d everywhere else (the suite
# shows it skipped, never passed); run it again on the same cluster with:
#   KUBECONFIG=... cargo nextest run -p macvtap-e2e --test cluster --run-ignored only
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${CLUSTER:-macvtap}
IMAGE=${IMAGE:-ghcr.io/kubevirt/macvtap-rs:v0.1.0}
MULTUS_VERSION=${MULTUS_VERSION:-v4.1.4}
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.5.0}

for tool in kind kubectl; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

# A kind node's /dev is a tmpfs that the node container got at start, not
# devtmpfs, so the /dev/tapN of a macvtap made later never appears in it and
# pods fail with "lstat /dev/tapN: no such file or directory"
# (kubevirt/macvtap-cni#39). Mounting the host's /dev over the node's /dev
# gives the node (and the DaemonSet's hostPath /dev) the host's devtmpfs.
# Recreate an older cluster (kind delete cluster --name $CLUSTER) to get it.
if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --config - <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - {hostPath: /dev, containerPath: /dev}
  - role: worker
    extraMounts:
      - {hostPath: /dev, containerPath: /dev}
KIND
fi
export KUBECONFIG=${KUBECONFIG:-$HOME/.kube/config}
kubectl config use-context "kind-$CLUSTER"

echo "==> Multus $MULTUS_VERSION"
kubectl apply -f "https://raw.githubusercontent.com/k8snetworkplumbingwg/multus-cni/$MULTUS_VERSION/deployments/multus-daemonset-thick.yml"
kubectl -n kube-system rollout status ds/kube-multus-ds --timeout=5m

echo "==> KubeVirt $KUBEVIRT_VERSION (software emulation)"
kubectl apply -f "https://github.com/kubevirt/kubevirt/releases/download/$KUBEVIRT_VERSION/kubevirt-operator.yaml"
kubectl apply -f "https://github.com/kubevirt/kubevirt/releases/download/$KUBEVIRT_VERSION/kubevirt-cr.yaml"
kubectl -n kubevirt patch kubevirt kubevirt --type merge \
  -p '{"spec":{"configuration":{"developerConfiguration":{"useEmulation":true,"featureGates":["NetworkBindingPlugins"]}}}}'
kubectl -n kubevirt wait kv kubevirt --for condition=Available --timeout=10m

echo "==> image $IMAGE"
hack/build-image.sh "$IMAGE"
kind load docker-image --name "$CLUSTER" "$IMAGE"

echo "==> cluster e2e"
cargo nextest run -p macvtap-e2e --test cluster --run-ignored only --no-capture
