#!/usr/bin/env bash
# A real single-node Kubernetes on this machine, as plain processes: etcd,
# kube-apiserver (TLS from a CA made at `up`; Node and RBAC authorizers,
# NodeRestriction, --allow-privileged), kube-controller-manager,
# kube-scheduler, kube-proxy (nftables), containerd 2.3 with Debian's runc and CDI on, and the
# kubelet 1.37 with cgroupfs on cgroup v1; a pause image built here and
# imported without a registry; the reference bridge CNI as the primary
# network; Multus thick v4.2.2 as its own DaemonSet (its own manifest, an
# image built here). Every binary is built from a pinned module under hack/peers/ (and
# hack/cluster/pause) with the machine's Go, into the same cache as
# test-support/src/gopeers.rs.
#
#   hack/cluster.sh up      build what is missing, start what is not running
#   hack/cluster.sh down    stop everything and remove all that `up` made
#   hack/cluster.sh env     print the variables a client needs (eval it)
#   hack/cluster.sh build   only build the binaries
#   hack/cluster.sh status  say which processes run and whether an earlier
#                           up's state is there
#   hack/cluster.sh image [NAME:TAG]  build our static binaries, pack them as
#                           the Containerfile does (hack/image-rootfs.sh)
#                           and import the image
#   hack/cluster.sh import-rootfs NAME:TAG ENTRYPOINT_JSON USER DIR
#                           pack DIR as a one-layer image and import it (the
#                           e2e's VM pod image)
#
# Needs root. Everything listens on loopback, or on the node address, a
# TEST-NET address on a link the script makes.
set -euo pipefail
# Under pipefail, `producer | grep -q` fails at random: grep -q exits at its
# first match and a producer still writing dies of SIGPIPE, which fails the
# pipeline. Pipelines here use `grep ... >/dev/null`, which reads to the end.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=$REPO/hack/peers

# --- where things live ------------------------------------------------------
if [[ -n ${MACVTAP_CACHE_DIR:-} ]]; then CACHE=$MACVTAP_CACHE_DIR
elif [[ -n ${XDG_CACHE_HOME:-} ]]; then CACHE=$XDG_CACHE_HOME/macvtap-rs
elif [[ -n ${HOME:-} ]]; then CACHE=$HOME/.cache/macvtap-rs
else echo "cluster.sh: neither \$MACVTAP_CACHE_DIR, \$XDG_CACHE_HOME nor \$HOME is set: set one" >&2; exit 1
fi
STATE=/var/lib/macvtap-rs-cluster   # certificates, etcd, containerd's root, logs
RUN=/run/macvtap-rs-cluster         # sockets, pid files, containerd's state
KUBELET_ROOT=/var/lib/kubelet       # where device plugins and Multus expect it
PKI=$STATE/pki
LOGS=$STATE/logs

NODE_NAME=macvtap-node
# All on TEST-NET-2: on the machines this project runs on, TEST-NET-1
# (192.0.2.0/24) is eth0's network and TEST-NET-3 holds the address the
# package registries are reached through (a pod route over 203.0.113.0/25
# once cut this machine off from them). `up` refuses ranges that overlap a
# route the machine has.
NODE_LINK=mvtrs-node0               # a port-less bridge holding the node address
NODE_IP=198.51.100.129
POD_SUBNET=198.51.100.0/25
POD_GATEWAY=198.51.100.1
POD_BRIDGE=mvtrs-cni0
SERVICE_CIDR=198.51.100.224/27      # kube-proxy (nftables) makes it lead somewhere
SERVICE_IP=198.51.100.225
APISERVER=https://$NODE_IP:6443      # the kubernetes Service's endpoint too
ETCD=http://127.0.0.1:2379
PAUSE_IMAGE=localhost/macvtap-rs/pause:1
MULTUS_VERSION=v4.2.2
MULTUS_IMAGE=localhost/macvtap-rs/multus-thick:$MULTUS_VERSION
# The CNI directories at their usual places: Multus thick's DaemonSet mounts
# them by these paths. Only the files named here are the cluster's; `down`
# removes those that were not there before `up`.
CNI_CONF_DIR=/etc/cni/net.d
CNI_BIN_DIR=/opt/cni/bin
CNI_CONF_FILES=(10-macvtap-rs-bridge.conflist 00-multus.conf)
CNI_BIN_FILES=(bridge host-local loopback multus-shim passthru macvtap macvtap.settings.json)
CONTAINERD_SOCK=$RUN/containerd/containerd.sock
RUNC=${RUNC:-/usr/sbin/runc}

K8S_VERSION=v1.37.2
# The sysctls the kubelet checks at start (pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables) and the values it wants; `up` sets them, so the kubelet
# runs with protectKernelDefaults and changes nothing itself.
SYSCTLS=(vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1
         kernel.keys.root_maxkeys=1000000 kernel.keys.root_maxbytes=25000000)

T0=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
say() { printf '[%6ss] %s\n' "$(since "$T0")" "$*" >&2; }
die() { say "error: $*"; exit 1; }
# step NAME CMD...: runs CMD and says how long it took.
step() {
  local name=$1 t; shift; t=$EPOCHREALTIME
  "$@"
  say "$name: done in $(since "$t") s"
}

# --- building ---------------------------------------------------------------
go_env() {
  env GOTOOLCHAIN=local GOFLAGS= GOWORK=off CGO_ENABLED=0 \
    GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" "$@"
}

# build_peer VAR MODULE_DIR TAGS LDFLAGS PACKAGE...: builds the packages in the
# module once, into $CACHE/go-peers/cluster-<module>-<first binary>-<key>/
# (a prefix of its own, so that neither builder takes the other's builds of
# the same programs, Multus' for one, for stale ones), keyed (as
# gopeers.rs does) by the Go version, the module's go.mod, go.sum and Go
# files, the packages and the flags; sets VAR to that directory. One build
# of a program set at a time, as gopeers.rs does: a second (hack/test.sh
# builds in the background while a user may run `up`) waits for the lock
# cluster-<module>-<first binary>.lock beside it, then finds its binaries.
BUILDER_VERSION=cluster-1
build_peer() {
  local var=$1 dir=$2 tags=$3 ldflags=$4; shift 4
  local module; module=$(basename "$dir")
  [[ -f $dir/go.mod ]] || die "$dir/go.mod is missing"
  command -v go >/dev/null || die "Go is not on PATH: install Go 1.26.8 or newer (hack/setup.sh says how)"
  local have need; have=$(go_env go env GOVERSION)
  need=$(awk '$1=="go"{print $2; exit}' "$dir/go.mod")
  if [[ $(printf '%s\n%s\n' "${have#go}" "$need" | sort -V | head -1) != "$need" ]]; then
    die "this machine's Go is $have, but $dir/go.mod says go $need: install Go $need or newer"
  fi
  local key
  key=$( { printf '%s\0' "$BUILDER_VERSION" "$have" "$tags" "$ldflags" "$*" "-mod=readonly -trimpath"
           cat "$dir"/go.mod; cat "$dir"/go.sum 2>/dev/null || true; cat "$dir"/*.go 2>/dev/null || true
         } | sha256sum | cut -c1-16)
  local first=${1##*/}
  local out=$CACHE/go-peers/cluster-$module-$first-$key
  local all=1 p
  for p in "$@"; do [[ -x $out/${p##*/} ]] || all=0; done
  if (( all )); then printf -v "$var" %s "$out"; return; fi
  mkdir -p "$CACHE/go-peers"
  local lock=$CACHE/go-peers/cluster-$module-$first.lock fd
  exec {fd}>>"$lock"
  if ! flock -n "$fd"; then
    say "waiting for another build of $module ($lock)"
    flock "$fd"
  fi
  all=1
  for p in "$@"; do [[ -x $out/${p##*/} ]] || all=0; done
  if (( all )); then exec {fd}>&-; printf -v "$var" %s "$out"; return; fi
  local tmp=$out.tmp t; rm -rf "$tmp"; mkdir -p "$tmp"; t=$(date +%s)
  say "building $module: $* (nice -n 19; a cold Kubernetes build takes minutes)"
  if ! (cd "$dir" && go_env nice -n 19 go build -mod=readonly -trimpath ${tags:+-tags "$tags"} \
          ${ldflags:+-ldflags "$ldflags"} -o "$tmp/" "$@") >"$tmp.log" 2>&1; then
    tail -30 "$tmp.log" >&2
    die "building $module in $dir failed (log above, whole in $tmp.log)"
  fi
  rm -rf "$out"; mv "$tmp" "$out"; rm -f "$tmp.log"
  # Earlier builds of the same programs are not needed again.
  for p in "$CACHE/go-peers/cluster-$module-$first-"*; do
    [[ $p != "$out" && $p =~ -[0-9a-f]{16}$ ]] && rm -rf "$p"
  done
  exec {fd}>&-
  say "built $module in $(( $(date +%s) - t )) s into $out"
  printf -v "$var" %s "$out"
}

K8S_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=37"

build_all() {
  step "etcd binary" build_peer ETCD_BIN "$PEERS/etcd" "" "" macvtap-rs.invalid/peers/etcd
  step "Kubernetes binaries" build_peer K8S_BIN "$PEERS/kubernetes" "" "$K8S_LDFLAGS" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  # containerd's Makefile stamps its version the same way.
  step "containerd binaries" build_peer CTRD_BIN "$PEERS/containerd" no_btrfs \
    "-X github.com/containerd/containerd/v2/version.Version=v2.3.7" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
  step "CNI plugins" build_peer CNI_BIN "$PEERS/cni-plugins" "" \
    "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v1.10.0" \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/main/loopback
  step "Multus thick binaries" build_peer MULTUS_BIN "$PEERS/multus" "" \
    "-X gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=$MULTUS_VERSION" \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/passthru-cni
  step "pause binary" build_peer PAUSE_BIN "$REPO/hack/cluster/pause" "" "" macvtap-rs.invalid/cluster/pause
}

# --- certificates -----------------------------------------------------------
# One CA signs every serving and client certificate; it is made once and kept
# until `down`.
cert() { # cert NAME SUBJECT EXTENSIONS
  local name=$1 subj=$2 ext=$3
  [[ -f $PKI/$name.crt && -f $PKI/$name.key ]] && return
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" $ext \
    > "$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days 30 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}
kubeconfig() { # kubeconfig NAME (uses $PKI/NAME.{crt,key})
  cat > "$STATE/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: macvtap-rs
  cluster: {server: $APISERVER, certificate-authority: $PKI/ca.crt}
users:
- name: $1
  user: {client-certificate: $PKI/$1.crt, client-key: $PKI/$1.key}
contexts:
- name: macvtap-rs
  context: {cluster: macvtap-rs, user: $1}
current-context: macvtap-rs
KC
}
make_pki() {
  mkdir -p "$PKI"; chmod 700 "$PKI"
  if [[ ! -f $PKI/ca.crt ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
      -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -subj "/CN=macvtap-rs-cluster-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  fi
  [[ -f $PKI/sa.key ]] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null; openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
  cert apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
  cert admin "/O=system:masters/CN=macvtap-rs-admin" "extendedKeyUsage=clientAuth"
  cert controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
  cert scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
  cert kube-proxy "/CN=system:kube-proxy" "extendedKeyUsage=clientAuth"
  # The kubelet's serving certificate, so the API server's exec/logs calls
  # can be verified against the same CA.
  cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=serverAuth subjectAltName=DNS:$NODE_NAME,IP:$NODE_IP,IP:127.0.0.1"
  local n; for n in admin controller-manager scheduler kubelet kube-proxy; do kubeconfig "$n"; done
}

# --- processes --------------------------------------------------------------
# A process `up` started is named by its pid file; it counts as running when
# that pid lives and runs the binary it was started from.
running() { # running NAME
  local pid; pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
  [[ -n $pid && -d /proc/$pid ]] && [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$(cat "$RUN/$1.exe" 2>/dev/null)" ]]
}
start() { # start NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  if running "$name"; then say "$name: already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  mkdir -p "$LOGS" "$RUN"
  setsid "$bin" "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! > "$RUN/$name.pid"; readlink -f "$bin" > "$RUN/$name.exe"
  say "$name: started (pid $!, log $LOGS/$name.log)"
}
stop() { # stop NAME: SIGTERM, then SIGKILL after 15 s
  local name=$1 pid i
  if ! running "$name"; then rm -f "$RUN/$name.pid" "$RUN/$name.exe"; return; fi
  pid=$(cat "$RUN/$name.pid"); kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
  if [[ -d /proc/$pid ]]; then say "$name (pid $pid) did not stop in 15 s: killing it"; kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; fi
  rm -f "$RUN/$name.pid" "$RUN/$name.exe"
  say "$name: stopped (pid $pid)"
}
# wait_for WHAT SECONDS NAME CMD...: polls CMD; fails naming WHAT and the
# last lines of NAME's log.
wait_for() {
  local what=$1 secs=$2 name=$3 end; shift 3
  end=$((SECONDS + secs))
  while ((SECONDS < end)); do
    "$@" >/dev/null 2>&1 && return
    if [[ -n $name ]] && ! running "$name"; then
      tail -20 "$LOGS/$name.log" >&2; die "$name exited before $what (log above, whole in $LOGS/$name.log)"
    fi
    sleep 0.5
  done
  [[ -n $name ]] && tail -20 "$LOGS/$name.log" >&2
  die "$what did not happen in $secs s${name:+ (the last lines of the $name log are above)}"
}
KUBECTL() { kubectl --kubeconfig "$STATE/admin.kubeconfig" "$@"; }
find_kubectl() {
  command -v kubectl >/dev/null && return
  # The project's Python venv (hack/setup.sh) carries kubectl.
  local v; for v in "${VIRTUAL_ENV:-}" "${MACVTAP_VENV:-/opt/macvtap-rs/venv}"; do
    [[ -n $v && -x $v/bin/kubectl ]] && { PATH=$v/bin:$PATH; return; }
  done
  die "kubectl is not on PATH (hack/setup.sh installs it into the project's venv)"
}

# --- configuration files ----------------------------------------------------
write_configs() {
  # CAP_SYS_RESOURCE is bit 24 of the effective capabilities.
  local capeff; capeff=$(awk '/^CapEff/{print $2}' /proc/self/status)
  RESTRICT_OOM=false; (( (0x$capeff >> 24) & 1 )) || RESTRICT_OOM=true
  mkdir -p "$STATE/containerd" "$RUN/containerd" "$CNI_CONF_DIR" "$CNI_BIN_DIR" "$STATE/cni/networks" \
    "$STATE/pod-logs"
  local b; for b in bridge host-local loopback; do install -m 755 "$CNI_BIN/$b" "$CNI_BIN_DIR/$b"; done
  # containerd 2.3 (config version 3; keys from internal/cri/config at
  # v2.3.7): its own root, state and socket; Debian's runc with a runc root
  # of its own; the pause image built here as the sandbox image; CDI on; the
  # CNI configuration below; network namespaces under its state directory.
  cat > "$STATE/containerd/config.toml" <<TOML
version = 3
root = '$STATE/containerd/root'
state = '$RUN/containerd/state'
[grpc]
  address = '$CONTAINERD_SOCK'
[ttrpc]
  address = '$RUN/containerd/containerd.sock.ttrpc'
[debug]
  address = ''
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '$PAUSE_IMAGE'
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
  # Network namespaces in /run/netns, where Multus thick's DaemonSet mounts
  # them from.
  netns_mounts_under_state_dir = false
  # Without CAP_SYS_RESOURCE (this machine's root lacks it) no process may
  # lower its oom_score_adj, and runc fails every sandbox (the kubelet asks
  # -998 for pause): clamp to containerd's own score instead.
  restrict_oom_score_adj = $RESTRICT_OOM
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$RUNC'
        Root = '$RUN/runc'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$CNI_BIN_DIR']
    conf_dir = '$CNI_CONF_DIR'
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '$RUN/nri/nri.sock'
TOML
  # The primary network: a bridge on TEST-NET-3 addresses, no masquerade
  # (no iptables rules) and no default route out of the node.
  # Written, never moved in: containerd reloads its CNI configuration on a
  # write event and ignores a create (internal/cri/server/cni_conf_syncer.go).
  local conf; conf=$(cat <<JSON
{
  "cniVersion": "1.0.0",
  "name": "macvtap-rs-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/networks",
        "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$POD_GATEWAY"}]],
        "routes": [{"dst": "$SERVICE_CIDR"}, {"dst": "$NODE_IP/32"}]
      }
    }
  ]
}
JSON
)
  [[ $(cat "$CNI_CONF_DIR/10-macvtap-rs-bridge.conflist" 2>/dev/null) == "$conf" ]] \
    || printf '%s\n' "$conf" > "$CNI_CONF_DIR/10-macvtap-rs-bridge.conflist"  # kube-proxy in nftables mode (its own tables "ip kube-proxy" and "ip6
  # kube-proxy"), so that the kubernetes Service reaches the API server the
  # way in-cluster clients (Multus thick, our daemon) expect. The conntrack
  # settings 0 leave the machine's sysctls alone.
  cat > "$STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: nftables
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: $POD_SUBNET
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
YAML
  cat > "$STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 (this kubelet is the last minor release that still allows it).
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
# up sets the sysctls the kubelet wants, so it need not change any.
protectKernelDefaults: true
podLogsDir: $STATE/pod-logs
# No DNS from the host for pods: nothing goes toward the host's network.
resolvConf: ""
failSwapOn: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
YAML
}

# An image as a Docker archive (containerd's images/archive importer reads
# it), one layer, written to ARCHIVE; no container engine.
# pack_image NAME ENTRYPOINT_JSON USER ROOTFS_DIR ARCHIVE
pack_image() {
  local name=$1 entry=$2 user=$3 root=$4 archive=$5
  local d; d=$(mktemp -d)
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -C "$root" -cf "$d/layer.tar" .
  local diff; diff=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"User":"%s"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entry" "$user" "$diff" > "$d/config.json"
  local cfg; cfg=$(sha256sum "$d/config.json" | cut -d' ' -f1); mv "$d/config.json" "$d/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$cfg" "$name" > "$d/manifest.json"
  tar -C "$d" -cf "$archive" manifest.json "$cfg.json" layer.tar
  rm -rf "$d"
}
# That archive imported into the k8s.io namespace; no registry.
# import_image NAME ENTRYPOINT_JSON USER ROOTFS_DIR
import_image() {
  local name=$1
  # Imported every time (a tenth of a second): the same content gives the
  # same digest, a changed one replaces the tag.
  local d; d=$(mktemp -d)
  pack_image "$@" "$d/image.tar"
  ctr_k8s images import --platform linux/amd64 "$d/image.tar" 2>&1 | grep -v DEPRECATION >&2 || true
  rm -rf "$d"
  say "image $name: imported"
}
# The sandbox image: the static pause program alone.
import_pause() {
  local r; r=$(mktemp -d)
  install -m 755 "$PAUSE_BIN/pause" "$r/pause"
  import_image "$PAUSE_IMAGE" '["/pause"]' 65535:65535 "$r"; rm -rf "$r"
}
# Multus thick's image as its Dockerfile.thick lays it out: the binaries in
# /usr/src/multus-cni/bin, multus-daemon the entrypoint; Debian's static
# busybox gives the `sh` and `cp` its install init container runs.
import_multus() {
  [[ -x /bin/busybox ]] || die "Multus thick's image needs /bin/busybox for sh and cp (apt-get install busybox-static)"
  local r; r=$(mktemp -d)
  mkdir -p "$r/usr/src/multus-cni/bin" "$r/bin" "$r/tmp"
  install -m 755 "$MULTUS_BIN/multus-daemon" "$MULTUS_BIN/multus-shim" "$r/usr/src/multus-cni/bin/"
  install -m 755 "$MULTUS_BIN/passthru-cni" "$r/usr/src/multus-cni/bin/passthru"
  install -m 755 /bin/busybox "$r/bin/busybox"; ln -s busybox "$r/bin/sh"; ln -s busybox "$r/bin/cp"
  # multus-daemon checks that it runs as root with os/user, which (without
  # cgo) reads /etc/passwd: Debian's slim base has one, so this image too.
  mkdir -p "$r/etc"; echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"; echo 'root:x:0:' > "$r/etc/group"
  # The shim names network namespaces as /var/run/netns/...; Debian's
  # /var/run is a link to /run, where the DaemonSet mounts /run/netns.
  mkdir -p "$r/var" "$r/run"; ln -s ../run "$r/var/run"
  import_image "$MULTUS_IMAGE" '["/usr/src/multus-cni/bin/multus-daemon"]' 0:0 "$r"; rm -rf "$r"
}
# Multus' own deployments/multus-daemonset-thick.yml from the module the
# build downloaded (go.sum pins its content), with the image built here.
multus_manifest() {
  local f=$CACHE/go/mod/gopkg.in/k8snetworkplumbingwg/multus-cni.v4@$MULTUS_VERSION/deployments/multus-daemonset-thick.yml
  [[ -f $f ]] || die "$f is missing: the Multus build should have downloaded it (run hack/cluster.sh build)"
  sed "s#image: ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot-thick#image: $MULTUS_IMAGE#" "$f"
}
ctr_k8s() { "$CTRD_BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# --- up ---------------------------------------------------------------------
preflight() {
  [[ $(id -u) == 0 ]] || die "cluster.sh needs root (it runs containerd and the kubelet)"
  command -v openssl >/dev/null || die "openssl is not installed (apt-get install openssl)"
  [[ -x $RUNC ]] || die "runc is not at $RUNC (apt-get install runc, or set RUNC)"
  command -v iptables-save >/dev/null || die "iptables is not installed (apt-get install iptables)"
  find_kubectl
  check_addresses
}

# The cluster's ranges must not hide a network the machine has: no route but
# the default one (and the cluster's own links) may cover them.
check_addresses() {
  local net r
  for net in "$POD_SUBNET" "$NODE_IP/32" "$SERVICE_CIDR"; do
    while IFS= read -r r; do
      [[ -z $r || $r == default* || $r == *" dev $POD_BRIDGE "* || $r == *" dev $NODE_LINK "* ]] && continue
      die "the cluster's range $net overlaps this machine's route '$r': change POD_SUBNET, NODE_IP or SERVICE_CIDR in $0"
    done < <(ip route show to match "${net%/*}"; ip route show root "$net")
  done
}

node_link() {
  if ! ip link show "$NODE_LINK" >/dev/null 2>&1; then
    # A bridge without ports, since this kernel may lack the dummy driver
    # (this machine's has no modules at all).
    ip link add "$NODE_LINK" type bridge
    say "node address: made link $NODE_LINK (a bridge without ports)"
  fi
  ip link set "$NODE_LINK" up
  ip addr show dev "$NODE_LINK" | grep "inet $NODE_IP/" >/dev/null || ip addr add "$NODE_IP/32" dev "$NODE_LINK"
  # Service addresses go nowhere (a bridge without ports) rather than out of
  # the default route.
  ip route replace "$SERVICE_CIDR" dev "$NODE_LINK"
}

# The kubelet's sysctls: what they were is kept (once) for `down`.
set_sysctls() {
  local kv k v old changed=()
  # net.ipv4.ip_forward too: the bridge plugin (isGateway) turns it on.
  [[ -f $STATE/sysctl.saved ]] || for kv in "${SYSCTLS[@]}" net.ipv4.ip_forward=; do
    k=${kv%%=*}; echo "$k=$(sysctl -n "$k")"; done > "$STATE/sysctl.saved"
  for kv in "${SYSCTLS[@]}"; do
    k=${kv%%=*}; v=${kv#*=}; old=$(sysctl -n "$k")
    [[ $old == "$v" ]] || { sysctl -q -w "$k=$v"; changed+=("$k $old -> $v"); }
  done
  if (( ${#changed[@]} )); then say "sysctls for the kubelet: ${changed[*]} (was: $STATE/sysctl.saved)"
  else say "sysctls for the kubelet: already set"; fi
}

# Directories outside $STATE and $RUN that the kubelet or containerd make at
# fixed places: the kubelet's root and its /var/log/containers links,
# containerd's shim sockets (/run/containerd/s) and libcni's result cache
# (/var/lib/cni/results). The first `up` notes which were absent; `down`
# removes those (the last two only as far as they are empty of others' files).
SYSTEM_DIRS=("$KUBELET_ROOT" /var/log/containers /run/containerd /var/lib/cni/multus /var/lib/cni /opt/cni
             /etc/cni/multus /etc/cni /run/multus /run/k8s.cni.cncf.io /run/netns)
record_system_dirs() {
  [[ -f $STATE/made-dirs ]] && return
  local d; for d in "${SYSTEM_DIRS[@]}"; do [[ -e $d ]] || echo "$d"; done > "$STATE/made-dirs"
  local f
  for f in "${CNI_CONF_FILES[@]/#/$CNI_CONF_DIR/}" "${CNI_BIN_FILES[@]/#/$CNI_BIN_DIR/}"; do
    [[ -e $f ]] || echo "$f"
  done > "$STATE/made-files"
  ls /run/netns 2>/dev/null > "$STATE/netns-before" || true
  # Mounts without propagation (mountinfo's optional fields empty), which
  # `mount --make-rshared /` below makes shared: down makes them private again.
  awk '$7 == "-" {print $5}' /proc/self/mountinfo > "$STATE/private-mounts"
}
# Multus thick's DaemonSet mounts / with HostToContainer and /opt/cni/bin
# with Bidirectional propagation, which containerd allows only from a shared
# (or slave) mount, as / is on a systemd host; here it is private.
shared_root() {
  awk '$5 == "/" && $7 ~ /^shared:/ {f=1} END {exit !f}' /proc/self/mountinfo && return
  mount --make-rshared /
  say "mounts: made / rshared (as systemd does; down makes private again what was)"
}
restore_propagation() {
  [[ -f $STATE/private-mounts ]] || return 0
  local mp n=0
  while IFS= read -r mp; do
    awk -v m="$mp" '$5 == m && $7 ~ /^shared:/ {f=1} END {exit !f}' /proc/self/mountinfo || continue
    mount --make-private "$mp" 2>/dev/null && n=$((n + 1))
  done < "$STATE/private-mounts"
  say "mounts: made $n mounts private again"
}
remove_system_dirs() {
  [[ -f $STATE/made-dirs ]] || return 0
  local f; while IFS= read -r f; do rm -f "$f"; done < "$STATE/made-files"
  # Multus' own files beside its configuration (its kubeconfig directory).
  rm -rf "$CNI_CONF_DIR/multus.d" /etc/cni/multus/net.d 2>/dev/null || true
  # Pod network namespaces containerd left (cni-<uuid>), not others'.
  local n; for n in $(ls /run/netns 2>/dev/null); do
    [[ $n == cni-* ]] || continue
    grep -qx "$n" "$STATE/netns-before" 2>/dev/null && continue
    umount "/run/netns/$n" 2>/dev/null; rm -f "/run/netns/$n" && say "netns: removed $n"
  done
  rm -f /var/lib/cni/results/macvtap-rs-pods-* 2>/dev/null || true
  local d removed=()
  while IFS= read -r d; do
    [[ -e $d ]] || continue
    case $d in
      # Wholly this cluster's: the kubelet's, and Multus' cache, directory
      # and daemon socket (left behind when Multus was killed).
      "$KUBELET_ROOT"|/var/log/containers|/var/lib/cni/multus|/etc/cni/multus|/run/multus) rm -rf "$d" ;;
      /run/netns) rmdir "$d" 2>/dev/null || true ;;
      *) find "$d" -depth -type d -empty -delete 2>/dev/null || true ;;
    esac
    [[ -e $d ]] && say "kept $d: it holds files of others" || removed+=("$d")
  done < "$STATE/made-dirs"
  MADE_DIRS=$(cat "$STATE/made-dirs")
  say "directories outside the cluster's own: removed ${removed[*]:-none}"
}

# What the firewall held before `up`, so `down` removes only what came after.
save_iptables() {
  [[ -f $STATE/iptables.saved ]] && return
  { iptables-save; echo "#ip6"; ip6tables-save 2>/dev/null || true; } | sed 's/\[[0-9]*:[0-9]*\]//; /^#/d' \
    > "$STATE/iptables.saved"
}

up() {
  preflight
  build_all
  mkdir -p "$STATE" "$RUN" "$LOGS"
  record_system_dirs
  save_iptables
  step "certificates" make_pki
  step "node address" node_link
  shared_root
  write_configs

  local t=$EPOCHREALTIME
  start etcd "$ETCD_BIN/etcd" --name=macvtap-node --data-dir="$STATE/etcd" \
    --listen-client-urls="$ETCD" --advertise-client-urls="$ETCD" \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=macvtap-node=http://127.0.0.1:2380 --unsafe-no-fsync=true
  wait_for "etcd answering on $ETCD" 60 etcd curl -fsS "$ETCD/health"
  say "etcd: healthy in $(since "$t") s"

  t=$EPOCHREALTIME
  start kube-apiserver "$K8S_BIN/kube-apiserver" --etcd-servers="$ETCD" \
    --bind-address="$NODE_IP" --secure-port=6443 --advertise-address="$NODE_IP" \
    --cert-dir="$PKI/apiserver-generated" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true
  wait_for "the API server's /readyz" 120 kube-apiserver KUBECTL get --raw /readyz
  say "kube-apiserver: ready in $(since "$t") s"

  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --controllers='*' --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --allocate-node-cidrs=false --service-cluster-ip-range="$SERVICE_CIDR"
  start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
  wait_for "kube-controller-manager's /healthz" 60 kube-controller-manager curl -fsSk https://127.0.0.1:10257/healthz
  wait_for "kube-scheduler's /healthz" 60 kube-scheduler curl -fsSk https://127.0.0.1:10259/healthz
  # Pods are refused until the service-account controller made "default".
  wait_for "the default service account" 60 kube-controller-manager KUBECTL -n default get serviceaccount default
  say "controller-manager and scheduler: healthy"

  t=$EPOCHREALTIME
  PATH=$CTRD_BIN:$PATH start containerd "$CTRD_BIN/containerd" --config "$STATE/containerd/config.toml"
  wait_for "containerd answering on $CONTAINERD_SOCK" 60 containerd "$CTRD_BIN/ctr" --address "$CONTAINERD_SOCK" version
  say "containerd: up in $(since "$t") s"
  import_pause

  set_sysctls
  t=$EPOCHREALTIME
  start kubelet "$K8S_BIN/kubelet" --config="$STATE/kubelet.yaml" --kubeconfig="$STATE/kubelet.kubeconfig" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --root-dir="$KUBELET_ROOT"
  wait_for "node $NODE_NAME Ready" 180 kubelet \
    bash -c "kubectl --kubeconfig '$STATE/admin.kubeconfig' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  say "kubelet: node $NODE_NAME Ready in $(since "$t") s"
  # kube-proxy after the node exists: it reads the node's addresses first.
  command -v nft >/dev/null || die "kube-proxy's nftables mode needs nft (apt-get install nftables)"
  start kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
  wait_for "kube-proxy's /healthz" 60 kube-proxy curl -fsS http://127.0.0.1:10256/healthz
  say "kube-proxy: healthy"

  t=$EPOCHREALTIME
  import_multus
  multus_manifest | KUBECTL apply -f - >/dev/null
  wait_for "Multus thick's DaemonSet Ready" 180 kubelet \
    bash -c "kubectl --kubeconfig '$STATE/admin.kubeconfig' -n kube-system rollout status ds/kube-multus-ds --timeout=2s"
  wait_for "Multus' $CNI_CONF_DIR/00-multus.conf" 60 kubelet test -s "$CNI_CONF_DIR/00-multus.conf"
  say "Multus thick $MULTUS_VERSION: DaemonSet Ready, 00-multus.conf written in $(since "$t") s"
  say "up: cluster ready; eval \"\$($0 env)\" for KUBECONFIG"
}

# --- down -------------------------------------------------------------------
# The processes of pods (in the kubelet's cgroups) and containerd's shims:
# started by this cluster, so `down` may end them by pid.
cluster_pids() {
  local f pid exe
  for f in /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
           /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs; do
    [[ -f $f ]] && cat "$f"
  done
  for pid in /proc/[0-9]*; do
    exe=$(readlink "$pid/exe" 2>/dev/null) || continue
    [[ $exe == "$CACHE"/go-peers/cluster-containerd-*/containerd-shim-runc-v2 ]] && echo "${pid#/proc/}"
  done
  return 0
} 2>/dev/null
# containerd puts its shims' sockets in /run/containerd/s whatever its state
# directory (a fixed path in containerd's pkg/shim); a shim that was killed
# (a run that was itself killed) leaves its socket file behind. With our
# shims ended, a socket there that no process has bound (none in
# /proc/net/unix) is dead: it is removed, so that the directory can go.
dead_shim_sockets() {
  local d=/run/containerd/s f n=0
  [[ -d $d ]] || return 0
  for f in "$d"/*; do
    [[ -S $f ]] || continue
    awk -v p="$f" '$NF == p {found=1} END {exit !found}' /proc/net/unix && continue
    rm -f "$f" && n=$((n + 1))
  done
  (( n == 0 )) || say "containerd: removed $n dead shim sockets from $d"
}
our_mounts() { # mount points under the cluster's directories, deepest first
  awk '{print $5}' /proc/self/mountinfo | grep -E "^($STATE|$RUN|$KUBELET_ROOT)(/|$)" | sort -r | uniq || true
}
iptables_now() {
  { iptables-save; echo "#ip6"; ip6tables-save 2>/dev/null || true; } | sed 's/\[[0-9]*:[0-9]*\]//; /^#/d'
}
# Removes the rules and chains added since `up` saved the firewall: each
# `-A` line and each chain of a table that the saved copy lacks.
saved_tables() { # saved_tables iptables|ip6tables
  if [[ $1 == iptables ]]; then awk '/^#ip6/{exit} 1' "$STATE/iptables.saved"
  else awk 'f; /^#ip6/{f=1}' "$STATE/iptables.saved"; fi
}
restore_iptables() {
  [[ -f $STATE/iptables.saved ]] || return 0
  local fam table line chain saved now removed=0
  for fam in iptables ip6tables; do
    command -v "$fam-save" >/dev/null || continue
    for table in $("$fam-save" | sed -n 's/^\*//p'); do
      saved=$(saved_tables "$fam" | awk -v t="$table" '/^\*/{in_t=(substr($0,2)==t)} in_t')
      now=$("$fam-save" -t "$table" | sed 's/\[[0-9]*:[0-9]*\]//')
      while IFS= read -r line; do
        [[ $line == -A* ]] || continue
        grep -qxF -- "$line" <<<"$saved" && continue
        eval "$fam -t $table -D ${line#-A }" && removed=$((removed + 1))
      done <<<"$now"
      while IFS= read -r line; do
        [[ $line == :* ]] || continue
        chain=${line#:}; chain=${chain%% *}
        grep -q -- "^:$chain " <<<"$saved" && continue
        "$fam" -t "$table" -F "$chain" 2>/dev/null || true
        "$fam" -t "$table" -X "$chain" 2>/dev/null && removed=$((removed + 1))
      done <<<"$now"
    done
  done
  say "iptables: removed $removed rules and chains added since up"
  # The kubelet's first rule makes the table itself (iptables-nft): an empty
  # table only nft can remove.
  local fam_nft
  for fam in iptables ip6tables; do
    [[ $fam == iptables ]] && fam_nft=ip || fam_nft=ip6
    for table in $("$fam-save" 2>/dev/null | sed -n 's/^\*//p'); do
      saved_tables "$fam" | grep -x "\*$table" >/dev/null && continue
      if "$fam-save" -t "$table" | grep '^-A\|^:[^ ]* - ' >/dev/null; then
        say "iptables: the $fam table $table did not exist before up and holds rules of others now: kept"
      elif command -v nft >/dev/null; then
        nft delete table "$fam_nft" "$table" && say "iptables: removed the $fam table $table (empty; it did not exist before up)"
      else
        say "iptables: the $fam table $table did not exist before up; it is empty now, and only nft can remove it (apt-get install nftables)"
      fi
    done
  done
}
restore_sysctls() {
  [[ -f $STATE/sysctl.saved ]] || return 0
  local kv back=()
  while IFS= read -r kv; do
    [[ $(sysctl -n "${kv%%=*}") == "${kv#*=}" ]] && continue
    sysctl -q -w "$kv"; back+=("$kv")
  done < "$STATE/sysctl.saved"
  say "sysctls restored: ${back[*]:-none had changed}"
}

down() {
  [[ $(id -u) == 0 ]] || die "cluster.sh down needs root"
  find_kubectl
  # With cached binaries missing (a cleaned cache) down still removes state.
  local c; for c in "$CACHE"/go-peers/cluster-containerd-containerd-*; do [[ -x $c/ctr ]] && CTRD_BIN=$c; done
  stop kube-scheduler; stop kube-controller-manager
  # Pods first, through the kubelet, so that their networks get CNI DEL.
  if running kube-apiserver && running kubelet; then
    local t=$EPOCHREALTIME n
    # Multus last: every other pod's CNI DEL goes through its daemon.
    KUBECTL delete pods --all-namespaces -l 'app!=multus' --grace-period=1 --wait=false >/dev/null 2>&1 || true
    for ((n = 0; n < 180; n++)); do
      [[ -z $(KUBECTL get pods -A -l 'app!=multus' -o name 2>/dev/null) ]] && break; sleep 0.5
    done
    KUBECTL delete pods --all-namespaces --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
    for ((n = 0; n < 60; n++)); do
      [[ -z $(KUBECTL get pods -A -o name 2>/dev/null) ]] && break; sleep 0.5
    done
    say "pods: deleted through the kubelet in $(since "$t") s"
  fi
  stop kubelet
  if running containerd && [[ -n ${CTRD_BIN:-} ]]; then
    local id
    for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_k8s containers ls -q 2>/dev/null); do ctr_k8s containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  local pids; pids=$(cluster_pids | sort -u | tr '\n' ' ')
  if [[ -n ${pids// } ]]; then say "ending leftover pod processes and shims: $pids"; kill -KILL $pids 2>/dev/null || true; sleep 1; fi
  dead_shim_sockets
  stop kube-proxy
  local fam
  for fam in ip ip6; do nft delete table "$fam" kube-proxy 2>/dev/null && say "nftables: removed kube-proxy's $fam table"; done
  stop kube-apiserver; stop etcd

  local m n=0
  for m in $(our_mounts); do umount "$m" 2>/dev/null || umount -l "$m"; n=$((n + 1)); done
  say "mounts: unmounted $n"
  # The kubelet's cgroups (kubepods and below) in every v1 hierarchy and in
  # the unified one, deepest first.
  n=0
  while IFS= read -r c; do rmdir "$c" 2>/dev/null && n=$((n + 1)) || say "cannot remove cgroup $c"; done \
    < <(find /sys/fs/cgroup -mindepth 1 -maxdepth 6 -type d -path '*/kubepods*' 2>/dev/null | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
  say "cgroups: removed $n"
  local l
  for l in $(ip -o link show master "$POD_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$l" 2>/dev/null && say "link: removed $l"
  done
  for l in "$POD_BRIDGE" "$NODE_LINK"; do ip link del "$l" 2>/dev/null && say "link: removed $l"; done
  restore_iptables
  restore_sysctls
  remove_system_dirs
  restore_propagation
  rm -rf "$STATE" "$RUN"
  say "directories: removed $STATE, $RUN"
  leftovers
}

# Says what of the cluster is still on the machine; fails if anything is.
leftovers() {
  local left=()
  local p; for p in $(cluster_pids | sort -u); do left+=("process $p ($(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-60))"); done
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == "$CACHE"/go-peers/cluster-* ]] && left+=("process ${p#/proc/} ($(readlink "$p/exe"))")
  done
  for p in $(our_mounts); do left+=("mount $p"); done
  for p in "$POD_BRIDGE" "$NODE_LINK"; do ip link show "$p" >/dev/null 2>&1 && left+=("link $p"); done
  for p in $(find /sys/fs/cgroup -maxdepth 3 -type d -name 'kubepods*' 2>/dev/null); do left+=("cgroup $p"); done
  for p in "$STATE" "$RUN" ${MADE_DIRS:-}; do [[ -e $p ]] && left+=("directory $p"); done
  [[ -e $CNI_CONF_DIR/00-multus.conf && -n ${MADE_DIRS:-} ]] && left+=("file $CNI_CONF_DIR/00-multus.conf")
  for p in ip ip6; do nft list table "$p" kube-proxy >/dev/null 2>&1 && left+=("nftables table $p kube-proxy"); done
  local rules; rules=$(iptables_now | grep -c '^-A\|^:KUBE' || true)
  (( rules == 0 )) || say "iptables: $rules rules or KUBE chains are there now (were they before up?)"
  if (( ${#left[@]} )); then
    printf 'left on the machine: %s\n' "${left[@]}" >&2; return 1
  fi
  say "down: nothing of the cluster is left (processes, mounts, links, cgroups, kube-proxy's tables, directories)"
}

# Our image, packed without a container engine as the Containerfile lays it
# out (FROM scratch: hack/image-rootfs.sh's file system, that is the static
# binaries, /macvtap-cni and busybox's cp, sh, test and ls; no USER; the
# device plugin as entrypoint), from hack/build-static.sh's binaries,
# imported into containerd's k8s.io namespace. The cluster must be up.
OUR_IMAGE_DEFAULT=localhost/macvtap-rs:cluster
image_cmd() {
  local image=${1:-$OUR_IMAGE_DEFAULT}
  running containerd || die "containerd is not running: hack/cluster.sh up first"
  local c; for c in "$CACHE"/go-peers/cluster-containerd-containerd-*; do [[ -x $c/ctr ]] && CTRD_BIN=$c; done
  local out=$REPO/target/static t=$EPOCHREALTIME
  nice -n 19 "$REPO/hack/build-static.sh" "" "$out" >&2
  say "static binaries: built in $(since "$t") s"
  local d; d=$(mktemp -d)
  pack_our_image "$image" "$out" "$d/image.tar"
  ctr_k8s images import --platform linux/amd64 "$d/image.tar" 2>&1 | grep -v DEPRECATION >&2 || true
  rm -rf "$d"
  say "image $image: imported"
  echo "$image"
}
# Our image as a Docker archive from the static binaries in STATIC_DIR (what
# image_cmd imports; e2e/tests/image.rs reads one).
# pack_our_image NAME STATIC_DIR ARCHIVE
pack_our_image() {
  local d; d=$(mktemp -d)
  MACVTAP_CACHE_DIR=$CACHE "$REPO/hack/image-rootfs.sh" "$2" "$d/rootfs" >&2
  pack_image "$1" '["/macvtap-deviceplugin"]' "" "$d/rootfs" "$3"
  rm -rf "$d"
}

# A directory packed as an image and imported, for images a test builds.
import_rootfs_cmd() {
  (( $# == 4 )) || die "usage: $0 import-rootfs NAME:TAG ENTRYPOINT_JSON USER DIR"
  running containerd || die "containerd is not running: hack/cluster.sh up first"
  [[ -d $4 ]] || die "$4 is not a directory"
  local c; for c in "$CACHE"/go-peers/cluster-containerd-containerd-*; do [[ -x $c/ctr ]] && CTRD_BIN=$c; done
  import_image "$1" "$2" "$3" "$4"
}

env_cmd() {
  [[ -f $STATE/admin.kubeconfig ]] || die "no cluster: run hack/cluster.sh up first"
  echo "export KUBECONFIG=$STATE/admin.kubeconfig"
  echo "export MACVTAP_CLUSTER_NODE=$NODE_NAME"
  echo "export MACVTAP_CLUSTER_NODE_IP=$NODE_IP"
  echo "export MACVTAP_CLUSTER_APISERVER=$APISERVER"
  echo "export CONTAINERD_ADDRESS=$CONTAINERD_SOCK"
  echo "export CONTAINERD_NAMESPACE=k8s.io"
  local c; for c in "$CACHE"/go-peers/cluster-containerd-containerd-*; do [[ -x $c/ctr ]] && echo "export MACVTAP_CLUSTER_CTR=$c/ctr"; done
  echo "export MACVTAP_CLUSTER_LOGS=$LOGS"
}

status() {
  local n; for n in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy containerd kubelet; do
    if running "$n"; then echo "$n: running (pid $(cat "$RUN/$n.pid"))"; else echo "$n: not running"; fi
  done
  # What an earlier `up` made stays until `down`, even when nothing runs.
  if [[ -d $STATE ]]; then echo "state: $STATE (made by an earlier up; down removes it)"; else echo "state: none"; fi
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0
case ${1:-} in
  up) step "up" up ;;
  down) step "down" down ;;
  env) env_cmd ;;
  build) build_all ;;
  status) status ;;
  image) shift; image_cmd "$@" ;;
  import-rootfs) shift; import_rootfs_cmd "$@" ;;
  *) echo "usage: $0 up | down | env | build | status | image [NAME:TAG] | import-rootfs NAME:TAG ENTRYPOINT_JSON USER DIR" >&2; exit 2 ;;
esac
