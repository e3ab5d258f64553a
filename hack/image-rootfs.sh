#!/usr/bin/env bash
# Lays out the image's whole file system in ROOTFS_DIR (which must not
# exist), from hack/build-static.sh's binaries in STATIC_DIR. The
# Containerfile's final stage, hack/build-image.sh --prebuilt and
# hack/cluster.sh image all ship exactly this:
#   /macvtap-deviceplugin, /macvtap   the daemon (entrypoint) and the CNI
#   /macvtap-cni                      the same CNI binary under the Go
#                                     project's name: its DaemonSet (and
#                                     cluster-network-addons-operator's) runs
#                                     `cp /macvtap-cni /host/opt/cni/bin/macvtap`
#   /bin/busybox                      from Debian's busybox-static, with
#   /bin/cp, /bin/sh, /bin/test,      links to it for what those DaemonSets
#   /bin/ls                           run: the copy and the `sh -c 'test -S ...'`
#                                     (or `ls`) probes
#   /usr/share/doc/busybox-static/copyright   busybox's licence (GPL-2)
# busybox-static is downloaded by name from this machine's apt sources
# (`apt-get download`, the candidate version; as root, `apt-get update`
# first when apt knows no candidate) and kept in the cache
# ($MACVTAP_CACHE_DIR, else $XDG_CACHE_HOME/macvtap-rs, else
# ~/.cache/macvtap-rs) under debs/; nothing is installed.
#   hack/image-rootfs.sh STATIC_DIR ROOTFS_DIR
set -euo pipefail
die() { echo "hack/image-rootfs.sh: $*" >&2; exit 1; }
[[ $# -eq 2 ]] || { echo "usage: hack/image-rootfs.sh STATIC_DIR ROOTFS_DIR" >&2; exit 2; }
static=$1 root=$2
for b in macvtap macvtap-deviceplugin; do
  [[ -f $static/$b ]] || die "$static/$b is missing; run hack/build-static.sh \"\" $static first"
done
[[ ! -e $root ]] || die "$root exists; give a path that does not"
if [[ -n ${MACVTAP_CACHE_DIR:-} ]]; then cache=$MACVTAP_CACHE_DIR
elif [[ -n ${XDG_CACHE_HOME:-} ]]; then cache=$XDG_CACHE_HOME/macvtap-rs
elif [[ -n ${HOME:-} ]]; then cache=$HOME/.cache/macvtap-rs
else die "neither \$MACVTAP_CACHE_DIR, \$XDG_CACHE_HOME nor \$HOME is set: set one"
fi

candidate() { apt-cache policy busybox-static 2>/dev/null | sed -n 's/^  Candidate: //p'; }
version=$(candidate)
# A machine whose package lists were never fetched knows no candidate: as
# root, fetch them once.
if [[ -z $version || $version == "(none)" ]] && [[ $(id -u) -eq 0 ]]; then
  apt-get update -qq >&2 || true
  version=$(candidate)
fi
[[ -n $version && $version != "(none)" ]] \
  || die "apt knows no busybox-static: run apt-get update (it is in Debian's main)"
debs=$cache/debs/busybox-static_$version
if ! compgen -G "$debs/busybox-static_*.deb" >/dev/null; then
  mkdir -p "$debs.tmp"
  # As root, apt says it downloads unsandboxed; that is all it says.
  (cd "$debs.tmp" && apt-get download -q "busybox-static=$version" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  compgen -G "$debs.tmp/busybox-static_*.deb" >/dev/null \
    || die "apt-get download busybox-static=$version failed (are Debian's packages reachable?)"
  rm -rf "$debs"; mv "$debs.tmp" "$debs"
fi
deb=$(compgen -G "$debs/busybox-static_*.deb" | head -1)
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
dpkg-deb -x "$deb" "$unpacked"
[[ -x $unpacked/bin/busybox ]] || die "$deb has no bin/busybox"
copyright=$unpacked/usr/share/doc/busybox-static/copyright
[[ -f $copyright ]] || die "$deb has no usr/share/doc/busybox-static/copyright"

mkdir -p "$root/bin" "$root/usr/share/doc/busybox-static"
install -m 755 "$static/macvtap-deviceplugin" "$root/macvtap-deviceplugin"
install -m 755 "$static/macvtap" "$root/macvtap"
# One file under two names (a hard link: a layer stores it once).
ln "$root/macvtap" "$root/macvtap-cni"
install -m 755 "$unpacked/bin/busybox" "$root/bin/busybox"
for applet in cp sh test ls; do ln -s busybox "$root/bin/$applet"; done
install -m 644 "$copyright" "$root/usr/share/doc/busybox-static/copyright"
echo "image file system in $root (busybox-static $version)"
