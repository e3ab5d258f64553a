#!/usr/bin/env bash
# Builds the image with podman or docker, whichever has a working engine.
#   hack/build-image.sh [IMAGE]                 compiles in the Containerfile's
#                                               Rust builder stage (pulls it)
#   hack/build-image.sh --prebuilt DIR [IMAGE]  packs the static binaries that
#                                               hack/build-static.sh put in DIR,
#                                               laid out by hack/image-rootfs.sh
#                                               (busybox-static from this
#                                               machine's apt sources, cached);
#                                               pulls no image
# IMAGE defaults to ghcr.io/kubevirt/macvtap-rs:v0.1.0.
set -euo pipefail
cd "$(dirname "$0")/.."
containerfile=$PWD/Containerfile
context=.
binaries=build
if [ "${1:-}" = "--prebuilt" ]; then
  [ -n "${2:-}" ] || { echo "hack/build-image.sh: --prebuilt needs a directory" >&2; exit 2; }
  binaries=prebuilt
  # The build context is a directory of its own holding only rootfs/.
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
  hack/image-rootfs.sh "$2" "$context/rootfs" >&2
  shift 2
fi
image=${1:-ghcr.io/kubevirt/macvtap-rs:v0.1.0}
args=(build -f "$containerfile" -t "$image" --build-arg VERSION="${image##*:}" --build-arg BINARIES="$binaries")
if command -v podman >/dev/null && podman --cgroup-manager cgroupfs info >/dev/null 2>&1; then
  # cgroupfs: works with or without systemd (a CI container has none).
  # nofile: podman's default for build containers (1048576) is above the
  # hard limit of some hosts and CI sandboxes, and then every RUN step fails.
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=1048576
  podman --cgroup-manager cgroupfs "${args[@]}" --ulimit "nofile=$nofile:$nofile" "$context"
  exit
fi
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  docker "${args[@]}" "$context"
  exit
fi
echo "hack/build-image.sh: no working podman or docker engine here." >&2
echo "hack/build-static.sh builds the same static binaries without one." >&2
exit 1
