//! A pinger for measuring loss: ICMP echo requests at a fixed interval from
//! a raw socket opened inside a namespace, with the send time of every
//! sequence number and the receive time of its reply.

use crate::sandbox::TestNs;
use anyhow::{Context, Result, bail};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static NEXT_ID: AtomicU16 = AtomicU16::new(0);

/// Every request sent, in sequence order, and when its reply came.
#[derive(Debug, Clone, Default)]
pub struct PingLog {
    /// Send time of sequence number `i`.
    pub sent: Vec<Instant>,
    /// Receive time of the reply to `i`, if one came.
    pub replied: Vec<Option<Instant>>,
}

/// What a ping log says about an interruption.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Requests sent from the first reply on.
    pub sent: usize,
    /// Of those, requests that got no reply.
    pub lost: usize,
    /// The longest time between two consecutive replies.
    pub longest_gap: Duration,
    /// From `after` to the first reply received after it.
    pub to_first_reply: Option<Duration>,
    /// The longest round trip of a request that got its reply (a request
    /// held in a queue and answered late shows here, not as a loss).
    pub max_rtt: Duration,
}

impl PingLog {
    /// When the first reply came.
    pub fn first_reply(&self) -> Option<Instant> {
        self.replied.iter().flatten().min().copied()
    }

    /// The first reply received after `t`.
    pub fn first_reply_after(&self, t: Instant) -> Option<Instant> {
        self.replied
            .iter()
            .flatten()
            .filter(|r| **r > t)
            .min()
            .copied()
    }

    /// How many replies came after `t`.
    pub fn replies_after(&self, t: Instant) -> usize {
        self.replied.iter().flatten().filter(|r| **r > t).count()
    }

    /// Loss, longest gap and time to the first reply after `after`, counted
    /// from the first reply (before it the VM may still be booting).
    pub fn figures(&self, after: Instant) -> Figures {
        let start = self.first_reply();
        let counted: Vec<Option<Instant>> = self
            .sent
            .iter()
            .zip(&self.replied)
            .filter(|(s, _)| start.is_some_and(|t| **s >= t))
            .map(|(_, r)| *r)
            .collect();
        let mut replies: Vec<Instant> = self.replied.iter().flatten().copied().collect();
        replies.sort();
        let longest_gap = replies
            .windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .max()
            .unwrap_or_default();
        Figures {
            sent: counted.len(),
            lost: counted.iter().filter(|r| r.is_none()).count(),
            longest_gap,
            to_first_reply: self
                .first_reply_after(after)
                .map(|r| r.duration_since(after)),
            max_rtt: self
                .sent
                .iter()
                .zip(&self.replied)
                .filter_map(|(s, r)| r.map(|r| r.duration_since(*s)))
                .max()
                .unwrap_or_default(),
        }
    }
}

/// A running pinger: one thread sends, one receives.
pub struct Pinger {
    log: Arc<Mutex<PingLog>>,
    stop_sending: Arc<AtomicBool>,
    stop_receiving: Arc<AtomicBool>,
    sender: Option<JoinHandle<Result<()>>>,
    receiver: Option<JoinHandle<Result<()>>>,
}

fn lock(log: &Mutex<PingLog>) -> MutexGuard<'_, PingLog> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Internet checksum (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![8, 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(b"macvtap-migrate!");
    let c = checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// The sequence number of an echo reply with identifier `id` from `from`
/// in `packet` (an IPv4 packet, as a raw socket receives it).
fn echo_reply_seq(packet: &[u8], id: u16, from: Ipv4Addr) -> Option<u16> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let src = Ipv4Addr::new(
        *packet.get(12)?,
        *packet.get(13)?,
        *packet.get(14)?,
        *packet.get(15)?,
    );
    let icmp = packet.get(ihl..)?;
    if src != from || *icmp.first()? != 0 || icmp.get(4..6)? != id.to_be_bytes() {
        return None;
    }
    Some(u16::from_be_bytes([*icmp.get(6)?, *icmp.get(7)?]))
}

impl Pinger {
    /// Starts pinging `target` every `interval` from namespace `ns`.
    pub fn start(ns: &TestNs, target: Ipv4Addr, interval: Duration) -> Result<Self> {
        // The socket belongs to the namespace it was opened in.
        let socket = ns.run(|| {
            Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
                .context("opening a raw ICMP socket")
        })?;
        socket.set_read_timeout(Some(Duration::from_millis(20)))?;
        let rx = socket.try_clone()?;
        // Tell this pinger's replies from any other's.
        let id = (std::process::id() as u16).wrapping_add(NEXT_ID.fetch_add(1, Ordering::SeqCst));
        let log = Arc::new(Mutex::new(PingLog::default()));
        let stop_sending = Arc::new(AtomicBool::new(false));
        let stop_receiving = Arc::new(AtomicBool::new(false));
        let to = SockAddr::from(SocketAddrV4::new(target, 0));
        let sender = {
            let (log, stop) = (log.clone(), stop_sending.clone());
            std::thread::spawn(move || -> Result<()> {
                let start = Instant::now();
                let mut seq: u32 = 0;
                while !stop.load(Ordering::SeqCst) {
                    if seq > u32::from(u16::MAX) {
                        bail!("the pinger ran out of sequence numbers");
                    }
                    let packet = echo_request(id, seq as u16);
                    {
                        let mut l = lock(&log);
                        l.sent.push(Instant::now());
                        l.replied.push(None);
                    }
                    // A send error (no route yet, a full queue) is a lost request.
                    let _ = socket.send_to(&packet, &to);
                    seq += 1;
                    let next = start + interval * seq;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                Ok(())
            })
        };
        let receiver = {
            let (log, stop) = (log.clone(), stop_receiving.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::SeqCst) {
                    let n = match (&rx).read(&mut buf) {
                        Ok(n) => n,
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            continue;
                        }
                        Err(e) => return Err(e).context("receiving ICMP"),
                    };
                    let now = Instant::now();
                    if let Some(seq) = echo_reply_seq(&buf[..n], id, target) {
                        let mut l = lock(&log);
                        if let Some(slot) = l.replied.get_mut(usize::from(seq)) {
                            slot.get_or_insert(now);
                        }
                    }
                }
                Ok(())
            })
        };
        Ok(Pinger {
            log,
            stop_sending,
            stop_receiving,
            sender: Some(sender),
            receiver: Some(receiver),
        })
    }

    /// A copy of the log so far.
    pub fn log(&self) -> PingLog {
        lock(&self.log).clone()
    }

    /// Waits up to `timeout` for `ready` to hold on the log, checking every
    /// 10 ms; returns whether it did.
    pub fn wait_for(&self, timeout: Duration, ready: impl Fn(&PingLog) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(&lock(&self.log)) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops sending, waits until every request has its reply or `grace`
    /// passed since the last one was sent (it then counts as lost), and
    /// returns the log.
    pub fn stop(mut self, grace: Duration) -> Result<PingLog> {
        self.stop_sending.store(true, Ordering::SeqCst);
        if let Some(s) = self.sender.take() {
            s.join()
                .map_err(|_| anyhow::anyhow!("the ping sender panicked"))??;
        }
        self.wait_for(grace, |l| l.replied.iter().all(Option::is_some));
        self.stop_receiving.store(true, Ordering::SeqCst);
        if let Some(r) = self.receiver.take() {
            r.join()
                .map_err(|_| anyhow::anyhow!("the ping receiver panicked"))??;
        }
        Ok(self.log())
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop_sending.store(true, Ordering::SeqCst);
        self.stop_receiving.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_request_checksums_to_zero() {
        let p = echo_request(0x1234, 7);
        assert_eq!(checksum(&p), 0);
        assert_eq!(&p[4..8], &[0x12, 0x34, 0, 7]);
    }

    #[test]
    fn only_our_replies_from_the_target_count() {
        let target = Ipv4Addr::new(192, 0, 2, 2);
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 192, 0, 2, 2, 192, 0, 2, 1,
        ];
        ip.extend_from_slice(&[0, 0, 0, 0, 0x12, 0x34, 0, 9]);
        assert_eq!(echo_reply_seq(&ip, 0x1234, target), Some(9));
        assert_eq!(echo_reply_seq(&ip, 0x1235, target), None);
        assert_eq!(
            echo_reply_seq(&ip, 0x1234, Ipv4Addr::new(192, 0, 2, 3)),
            None
        );
        ip[20] = 8; // a request, not a reply
        assert_eq!(echo_reply_seq(&ip, 0x1234, target), None);
    }

    #[test]
    fn figures_count_from_the_first_reply() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let log = PingLog {
            sent: (0..6).map(|i| ms(i * 10)).collect(),
            replied: vec![None, Some(ms(11)), None, None, Some(ms(41)), Some(ms(51))],
        };
        let f = log.figures(ms(35));
        // Requests 2 to 5 were sent after the first reply; 2 and 3 got none.
        assert_eq!((f.sent, f.lost), (4, 2));
        assert_eq!(f.longest_gap, Duration::from_millis(30));
        assert_eq!(f.to_first_reply, Some(Duration::from_millis(6)));
        assert_eq!(f.max_rtt, Duration::from_millis(1));
    }
}
