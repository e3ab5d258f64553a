//! Every Ethernet frame seen on one interface of a test namespace, from an
//! `AF_PACKET` socket opened inside it: what a link really sent, as a switch
//! port sees it, for tests that assert a link stayed silent or spoke.

use crate::netns::TestNs;
use anyhow::{Context, Result, anyhow};
use nix::sys::socket::{
    AddressFamily, LinkAddr, SockFlag, SockProtocol, SockType, recvfrom, setsockopt, socket,
    sockopt,
};
use nix::sys::time::TimeVal;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One captured Ethernet frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The source MAC.
    pub src: [u8; 6],
    /// Whether the interface sent it (`PACKET_OUTGOING`) rather than
    /// received it: on a bridge port, outgoing frames are the bridge's
    /// forwarding, incoming ones what the far end sent.
    pub outgoing: bool,
    /// The whole frame, from the destination MAC on.
    pub bytes: Vec<u8>,
}

impl Frame {
    /// An ICMPv6 router solicitation (IPv6 next header 58, type 133).
    pub fn is_router_solicitation(&self) -> bool {
        self.bytes.len() > 54
            && self.bytes[12..14] == [0x86, 0xdd]
            && self.bytes[20] == 58
            && self.bytes[54] == 133
    }

    /// The EtherType, as people write it (`0x86dd`).
    pub fn ethertype(&self) -> String {
        match self.bytes.get(12..14) {
            Some(t) => format!("0x{:02x}{:02x}", t[0], t[1]),
            None => "none".into(),
        }
    }
}

/// A capture running on a thread of its own until dropped or stopped.
///
/// A packet socket sees every interface of its namespace (`SO_BINDTODEVICE`
/// does not narrow it), so frames are kept by the interface index the
/// kernel reports for each.
pub struct Capture {
    frames: Arc<Mutex<Vec<Frame>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock(frames: &Mutex<Vec<Frame>>) -> MutexGuard<'_, Vec<Frame>> {
    frames.lock().unwrap_or_else(|e| e.into_inner())
}

impl Capture {
    /// Starts capturing every frame, both directions, on `ifname` in `ns`.
    pub fn start(ns: &TestNs, ifname: &str) -> Result<Self> {
        let netns = macvtap_link::Netns::open(ns.path())?;
        let name = ifname.to_string();
        let open = move || -> nix::Result<(OwnedFd, usize)> {
            let index = nix::net::if_::if_nametoindex(name.as_str())?;
            let fd = socket(
                AddressFamily::Packet,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::EthAll,
            )?;
            setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 50_000))?;
            Ok((fd, usize::try_from(index).unwrap_or(usize::MAX)))
        };
        let (fd, index) = netns
            .run(move || Ok(open()))?
            .with_context(|| format!("an AF_PACKET socket on {ifname} in {}", ns.name))?;
        let frames: Arc<Mutex<Vec<Frame>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (frames.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::SeqCst) {
                // A timeout (every 50 ms) only lets the loop see `stop`.
                if let Ok((n, Some(from))) = recvfrom::<LinkAddr>(fd.as_raw_fd(), &mut buf)
                    && from.ifindex() == index
                    && n >= 14
                {
                    let mut src = [0u8; 6];
                    src.copy_from_slice(&buf[6..12]);
                    lock(&f).push(Frame {
                        src,
                        outgoing: from.pkttype() == nix::libc::PACKET_OUTGOING,
                        bytes: buf[..n].to_vec(),
                    });
                }
            }
        });
        Ok(Capture {
            frames,
            stop,
            thread: Some(thread),
        })
    }

    /// The frames captured so far.
    pub fn frames(&self) -> Vec<Frame> {
        lock(&self.frames).clone()
    }

    /// Waits up to `timeout` until a frame matching `pred` was captured;
    /// returns whether one was.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&Frame) -> bool) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if lock(&self.frames).iter().any(&pred) {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops capturing and returns every frame captured.
    pub fn stop(mut self) -> Result<Vec<Frame>> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| anyhow!("the capture thread panicked"))?;
        }
        Ok(self.frames())
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

/// Parses a MAC as people write it (`02:00:c0:00:02:02`).
pub fn mac(s: &str) -> Result<[u8; 6]> {
    macvtap_link::link::parse_mac(s).with_context(|| format!("{s:?} is not a MAC"))
}
