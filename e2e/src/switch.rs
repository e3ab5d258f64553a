//! One L2 segment shared by several sandbox nodes, as a rack switch joins
//! real nodes: a Linux bridge `br0` in its own "switch" namespace, the peer
//! host on one port and each node's NIC (`lower0`, a veth) on another. The
//! bridge learns and ages its FDB as a switch does (learning on, default
//! ageing of 300 s, no STP), so a frame sent from a MAC on the wrong port
//! misdirects the traffic to that MAC exactly as it would on real hardware.

use crate::node::{Node, PEER_IP, TapLock, tap_lock};
use crate::sandbox::TestNs;
use anyhow::Result;
use std::sync::Arc;

/// The switch, the peer host on it and the test's tap-node lock.
pub struct Segment {
    /// The switch's namespace, holding bridge `br0` and its ports.
    pub switch: TestNs,
    /// The peer host at [`PEER_IP`]/24, on switch port `peer-port`.
    pub peer: Arc<TestNs>,
    lock: TapLock,
}

impl Segment {
    /// Makes the switch and the peer host, and takes the tap-node lock that
    /// every node of this segment shares.
    pub fn new() -> Result<Self> {
        let lock = tap_lock()?;
        let switch = TestNs::new("switch")?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let peer = TestNs::new("peer")?;
        switch.add_nic_to("peer-port", &peer, "peer0")?;
        switch.ip(&["link", "set", "peer-port", "master", "br0"])?;
        peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "peer0"])?;
        Ok(Segment {
            switch,
            peer: Arc::new(peer),
            lock,
        })
    }

    /// A new node whose NIC `lower0` is the other end of switch port `port`.
    ///
    /// `/dev/tapN` is named after the macvtap's ifindex, and every fresh
    /// namespace numbers its links from 1, so two nodes made the same way
    /// would both get, say, `/dev/tap3` for their first macvtap: the second
    /// node's Allocate would find the first node's char device (on real
    /// nodes each host has its own `/dev`). The kernel hands out indices in
    /// a namespace cyclically, after the highest one it gave, so creating
    /// and deleting `skip` links first moves this node's macvtaps to a range
    /// of their own: give each node of a segment a different `skip`, wider
    /// than the number of macvtaps the test makes on any node.
    pub fn node(&self, port: &str, skip: u32) -> Result<Node> {
        let ns = TestNs::new(port)?;
        for i in 0..skip.div_ceil(2) {
            let (a, b) = (format!("skip{i}a"), format!("skip{i}b"));
            ns.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
            ns.ip(&["link", "del", &a])?;
        }
        ns.add_nic_to("lower0", &self.switch, port)?;
        self.switch.ip(&["link", "set", port, "master", "br0"])?;
        Node::with_nic(ns, self.peer.clone(), self.lock.clone())
    }

    /// The switch port on which the bridge has learned `mac` now, if any.
    pub fn port_of(&self, mac: &str) -> Result<Option<String>> {
        let out = crate::sandbox::sh(&[
            "bridge",
            "-n",
            &self.switch.name,
            "-j",
            "fdb",
            "show",
            "br",
            "br0",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(v.as_array().and_then(|a| {
            a.iter()
                .filter(|e| {
                    e["mac"]
                        .as_str()
                        .is_some_and(|m| m.eq_ignore_ascii_case(mac))
                })
                .filter(|e| e["state"].as_str() != Some("permanent"))
                .find_map(|e| e["ifname"].as_str().map(str::to_string))
        }))
    }
}
