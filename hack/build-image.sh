#!/usr/bin/env bash
# Builds the image with podman or docker, whichever has a working engine.
#   hack/build-image.sh [IMAGE]   (default ghcr.io/kubevirt/macvtap-rs:v0.1.0)
set -euo pipefail
cd "$(dirname "$0")/.."
image=${1:-ghcr.io/kubevirt/macvtap-rs:v0.1.0}
for engine in podman docker; do
  if command -v "$engine" >/dev/null && "$engine" info >/dev/null 2>&1; then
    exec "$engine" build -f Containerfile -t "$image" --build-arg VERSION="${image##*:}" .
  fi
done
echo "hack/build-image.sh: no working podman or docker engine here." >&2
echo "hack/build-static.sh builds the same static binaries without one." >&2
exit 1
