#!/usr/bin/env bash
# Measures the device plugin's footprint as BENCHMARKS.md's "Metrics
# endpoint" table reports it: the release binary's size, the idle RSS of a
# running daemon, and /metrics scrape latency. Needs root (a network
# namespace stands in for the node). Usage:
#   hack/metrics-footprint.sh [BINARY] [SCRAPES]
# BINARY defaults to target/release/macvtap-deviceplugin ($CARGO_TARGET_DIR
# instead of target when set; cargo build
# --release -p macvtap-deviceplugin); SCRAPES to 500.
#
# The daemon serves one resource of 100 devices on a veth "NIC" eth1, with
# no kubelet (its registration retries with backoff, as on a node whose
# kubelet is down), JSON logs, and --metrics-addr 127.0.0.1:19402. Idle RSS
# is VmRSS 5 s after /healthz first answers, and the anonymous part of it
# (RssAnon: the rest is the binary's and libraries' code pages, shared page
# cache). Each scrape is one GET
# /metrics on a new TCP connection (as Prometheus without keep-alive),
# timed from connect to the last body byte, after 20 warm-up scrapes.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${CARGO_TARGET_DIR:-target}/release/macvtap-deviceplugin}
scrapes=${2:-500}
[ "$(id -u)" = 0 ] || { echo "needs root (a network namespace)" >&2; exit 1; }
[ -x "$bin" ] || { echo "$bin: no such binary; build it first" >&2; exit 1; }
ns=mvfp$$
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add eth1 type veth peer name eth1p
ip -n "$ns" link set eth1 up
ip -n "$ns" link set eth1p up
mkdir -p "$work/kubelet/device-plugins"
ip netns exec "$ns" "$bin" --kubelet-dir "$work/kubelet" \
    --resource name=fp,lowerDevice=eth1,capacity=100 \
    --metrics-addr 127.0.0.1:19402 --log-format json >"$work/log" 2>&1 &
pid=$!
size=$(stat -c %s "$bin")
ip netns exec "$ns" python3 - "$pid" "$scrapes" "$size" <<'EOF'
import socket, statistics, sys, time

pid, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def get(path):
    s = socket.create_connection(("127.0.0.1", 19402), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    return out

end = time.monotonic() + 30
while True:
    try:
        if get("/healthz").startswith(b"HTTP/1.1 200"):
            break
    except OSError:
        pass
    if time.monotonic() > end:
        sys.exit("the daemon did not answer /healthz within 30 s")
    time.sleep(0.05)
time.sleep(5)
status = {l.split(":")[0]: l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith(("VmRSS:", "RssAnon:"))}
rss, anon = int(status["VmRSS"]), int(status["RssAnon"])
for _ in range(20):
    get("/metrics")
lat = []
for _ in range(n):
    t = time.perf_counter()
    page = get("/metrics")
    lat.append((time.perf_counter() - t) * 1000)
    assert page.startswith(b"HTTP/1.1 200"), page[:200]
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(f"binary size: {size / 1048576:.2f} MiB ({size} bytes)")
print(f"idle RSS: {rss / 1024:.1f} MiB ({rss} KiB), of it anonymous {anon} KiB")
print(f"scrape latency over {n} scrapes: p50 {q(0.5):.3f} ms, p99 {q(0.99):.3f} ms")
print(f"page size: {len(page)} bytes")
EOF
