//! The link event monitor, in a fresh network namespace. Needs root; without
//! it the test fails with "NOT RUN".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_link::monitor::{LinkEvent, LinkMonitor};
use macvtap_link::{Handle, Link, Links};
use std::sync::mpsc;
use std::time::Duration;
use test_support::TestNs;

#[test]
fn monitor_reports_links_appearing_changing_and_vanishing() {
    let ns = TestNs::new("mon").unwrap();
    let netns = ns.netns().unwrap();
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
    ns.ip(&["link", "add", "m0", "type", "veth", "peer", "name", "m1"])
        .unwrap();
    wait_for(&|e| matches!(e, LinkEvent::Changed(l) if l.name == "m0"));
    ns.ip(&["link", "set", "m0", "up"]).unwrap();
    let LinkEvent::Changed(up) =
        wait_for(&|e| matches!(e, LinkEvent::Changed(l) if l.name == "m0" && l.is_up()))
    else {
        unreachable!()
    };
    // The event carries the link's whole state, decoded as a dump decodes it.
    let dumped: Link = Handle::in_netns(&netns)
        .unwrap()
        .list_links()
        .unwrap()
        .into_iter()
        .find(|l| l.name == "m0")
        .unwrap();
    assert_eq!(up.index, dumped.index);
    assert_eq!(up.kind.as_deref(), Some("veth"));
    assert_eq!(
        (up.mtu, up.mac, up.flags),
        (dumped.mtu, dumped.mac, dumped.flags)
    );
    assert_eq!(up.txqueuelen, dumped.txqueuelen);
    ns.ip(&["link", "del", "m0"]).unwrap();
    let LinkEvent::Removed(gone) =
        wait_for(&|e| matches!(e, LinkEvent::Removed(l) if l.name == "m0"))
    else {
        unreachable!()
    };
    assert_eq!(gone.index, dumped.index);
}
