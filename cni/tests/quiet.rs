//! The pod-side macvtap sends nothing of its own: without IPAM, no frame
//! with the VM's MAC leaves before the guest's (no IPv6 DAD, router
//! solicitation or MLD report). During a live migration such frames would
//! teach the switches that the VM lives on the target while it still runs on
//! the source. With IPAM the link keeps IPv6. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Sandbox, netconf};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, recv, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use serde_json::json;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use test_support::{TestNs, sh, unique_ifindex};

/// One captured Ethernet frame.
#[derive(Debug, Clone)]
struct Frame {
    src: [u8; 6],
    bytes: Vec<u8>,
}

impl Frame {
    /// An ICMPv6 router solicitation (IPv6 next header 58, type 133).
    fn is_router_solicitation(&self) -> bool {
        self.bytes.len() > 54
            && self.bytes[12..14] == [0x86, 0xdd]
            && self.bytes[20] == 58
            && self.bytes[54] == 133
    }
}

/// Every frame seen on an interface of a namespace, from an `AF_PACKET`
/// socket opened inside it.
struct Capture {
    frames: Arc<Mutex<Vec<Frame>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    fn start(ns: &TestNs, ifname: &str) -> Self {
        let netns = macvtap_link::Netns::open(ns.path()).unwrap();
        let ifname = ifname.to_string();
        let fd: OwnedFd = netns
            .run(move || {
                let fd = socket(
                    AddressFamily::Packet,
                    SockType::Raw,
                    SockFlag::SOCK_CLOEXEC,
                    SockProtocol::EthAll,
                )
                .unwrap();
                setsockopt(&fd, sockopt::BindToDevice, &ifname.into()).unwrap();
                setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 50_000)).unwrap();
                Ok(fd)
            })
            .unwrap();
        let frames: Arc<Mutex<Vec<Frame>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (frames.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::SeqCst) {
                if let Ok(n) = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                    if n >= 14 {
                        let mut src = [0u8; 6];
                        src.copy_from_slice(&buf[6..12]);
                        f.lock().unwrap().push(Frame {
                            src,
                            bytes: buf[..n].to_vec(),
                        });
                    }
                }
            }
        });
        Capture {
            frames,
            stop,
            thread: Some(thread),
        }
    }

    fn frames(&self) -> Vec<Frame> {
        self.frames.lock().unwrap().clone()
    }

    /// Waits until a frame matching `pred` was captured.
    fn wait_for(&self, what: &str, pred: impl Fn(&Frame) -> bool) {
        let end = Instant::now() + Duration::from_secs(15);
        while !self.frames().iter().any(&pred) {
            assert!(Instant::now() < end, "no {what} within 15 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn mac(s: &str) -> [u8; 6] {
    macvtap_link::link::parse_mac(s).unwrap()
}

/// `disable_ipv6` of `net1`, read inside the pod namespace.
fn pod_disable_ipv6(sb: &Sandbox) -> String {
    let path = "/proc/sys/net/ipv6/conf/net1/disable_ipv6";
    let out = sh(&["ip", "netns", "exec", &sb.pod.name, "cat", path]).unwrap();
    out.trim().to_string()
}

#[test]
fn without_ipam_the_pod_link_sends_nothing_with_the_vms_mac() {
    let sb = Sandbox::new();
    let capture = Capture::start(&sb.peer, "peer0");
    let vm_mac = "02:00:00:00:16:01";
    sb.allocate("eth0Mvp1");
    sb.cni(
        "ADD",
        &netconf("1.0.0", "eth0Mvp1"),
        &[("CNI_ARGS", &format!("IgnoreUnknown=true;MAC={vm_mac}"))],
    )
    .ok();
    assert_eq!(pod_disable_ipv6(&sb), "1");

    // A control brought up after ours, the way a plain `ip link set up`
    // leaves a link: its first router solicitation comes after its DAD (at
    // least a second after it came up), and by then a chatty link that came
    // up earlier has sent its MLD report and DAD probe (within a second).
    let control_ns = TestNs::new("ctl").unwrap();
    let control_mac = "02:00:00:00:16:02";
    sb.add_macvtap("ctl0", unique_ifindex());
    sb.node
        .ip(&[
            "link",
            "set",
            "ctl0",
            "address",
            control_mac,
            "netns",
            &control_ns.name,
        ])
        .unwrap();
    control_ns.ip(&["link", "set", "ctl0", "up"]).unwrap();
    capture.wait_for("router solicitation from the control link", |f| {
        f.src == mac(control_mac) && f.is_router_solicitation()
    });

    let ours: Vec<Frame> = capture
        .frames()
        .into_iter()
        .filter(|f| f.src == mac(vm_mac))
        .collect();
    assert!(
        ours.is_empty(),
        "{} frames left with the VM's MAC before any guest ran: {:x?}",
        ours.len(),
        ours.first().map(|f| &f.bytes)
    );
    control_ns.ip(&["link", "del", "ctl0"]).unwrap();
    sb.pod.ip(&["link", "del", "net1"]).unwrap();
}

#[test]
fn with_ipam_the_pod_link_keeps_ipv6() {
    let sb = Sandbox::new();
    sb.allocate("eth0Mvp2");
    let mut conf = netconf("1.0.0", "eth0Mvp2");
    conf["ipam"] = json!({
        "type": "static",
        "addresses": [{"address": "2001:db8::16/64"}]
    });
    sb.cni("ADD", &conf, &[]).ok();
    assert_eq!(pod_disable_ipv6(&sb), "0");
    let addrs = sb.pod.ip(&["-6", "addr", "show", "dev", "net1"]).unwrap();
    assert!(addrs.contains("2001:db8::16/64"), "{addrs}");
    sb.pod.ip(&["link", "del", "net1"]).unwrap();
}
