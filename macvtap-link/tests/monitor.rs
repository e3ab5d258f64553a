//! The link event monitor, in a fresh network namespace. Needs root; without
//! it the test fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_link::Netns;
use macvtap_link::monitor::{LinkEvent, LinkMonitor};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::{Ns, ip};

#[test]
fn monitor_reports_links_appearing_changing_and_vanishing() {
    let ns = Ns::new("mon");
    let netns = Netns::open(format!("/run/netns/{}", ns.0)).unwrap();
    let monitor = LinkMonitor::in_netns(&netns).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(events) = monitor.recv() {
            for e in events {
                if tx.send(e).is_err() {
                    return;
                }
            }
        }
    });
    let wait_for = |want: &dyn Fn(&LinkEvent) -> bool| loop {
        let e = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("an event within 10 s");
        if want(&e) {
            return e;
        }
    };
    ip(&[
        "-n", &ns.0, "link", "add", "m0", "type", "veth", "peer", "name", "m1",
    ]);
    wait_for(&|e| matches!(e, LinkEvent::Changed { name, .. } if name == "m0"));
    ip(&["-n", &ns.0, "link", "set", "m0", "up"]);
    wait_for(
        &|e| matches!(e, LinkEvent::Changed { name, flags, .. } if name == "m0" && flags & 1 == 1),
    );
    ip(&["-n", &ns.0, "link", "del", "m0"]);
    wait_for(&|e| matches!(e, LinkEvent::Removed { name, .. } if name == "m0"));
}
