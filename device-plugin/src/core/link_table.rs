//! The node's links, kept current from netlink link events.
//!
//! A dedicated thread blocks on a `RTNLGRP_LINK` subscription (see
//! [`macvtap_link::monitor`]) and passes each batch of events on
//! ([`LinkUpdate::Events`]). Each event carries its link's whole state, so
//! the one [`LinkTable`], which the daemon owns, applies it and says what
//! it changed ([`LinkTable::apply`]); the thread reads every link again
//! only at start and after lost events ([`LinkUpdate::Resync`]). Health and
//! auto-discovery thus react within milliseconds, nothing polls, and a
//! node's churn of unrelated links costs no dump. The daemon never changes
//! namespace, so the thread's sockets belong to the namespace the daemon
//! was started in (the host's).

use crate::error::Result;
use macvtap_link::monitor::{LinkEvent, LinkMonitor};
use macvtap_link::{Handle, Link, Links};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{error, warn};

/// How long to pause after a failed read of link events, so a lasting
/// error does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

/// What the link watcher sends the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkUpdate {
    /// Every link, read again because events were lost.
    Resync(Vec<Link>),
    /// Links that appeared, changed or vanished, in the kernel's order
    /// (never [`LinkEvent::Overrun`]: lost events come as a resync).
    Events(Vec<LinkEvent>),
}

/// One link's change: its state before (`None` if it is new) and after
/// (`None` if it vanished).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkDelta {
    /// The link as it was.
    pub before: Option<Link>,
    /// The link as it is now.
    pub after: Option<Link>,
}

impl LinkDelta {
    /// Both states of the link, the old one first (one or two links).
    pub(crate) fn states(&self) -> impl Iterator<Item = &Link> {
        self.before.iter().chain(self.after.iter())
    }
}

/// Every link of a namespace, in ifindex order, kept by applying events
/// (not to be confused with [`macvtap_link::Links`], a namespace's link
/// operations).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LinkTable {
    links: Vec<Link>,
}

impl LinkTable {
    /// A table of `links` (as a dump gives them, in any order).
    pub(crate) fn new(mut links: Vec<Link>) -> Self {
        links.sort_by_key(|l| l.index);
        Self { links }
    }

    /// The links, in ifindex order.
    pub(crate) fn links(&self) -> &[Link] {
        &self.links
    }

    /// The link named `name`, if there is one.
    pub(crate) fn by_name(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }

    /// Applies one event; returns what it changed, or `None` when it
    /// changed nothing this table holds (or is [`LinkEvent::Overrun`]).
    pub(crate) fn apply(&mut self, event: &LinkEvent) -> Option<LinkDelta> {
        let delta = match event {
            LinkEvent::Changed(l) => {
                let before = self.get(l.index).cloned();
                if before.as_ref() == Some(l) {
                    return None;
                }
                LinkDelta {
                    before,
                    after: Some(l.clone()),
                }
            }
            LinkEvent::Removed(l) => LinkDelta {
                before: Some(self.get(l.index)?.clone()),
                after: None,
            },
            LinkEvent::Overrun => return None,
        };
        self.apply_delta(&delta);
        Some(delta)
    }

    /// Applies a change that [`LinkTable::apply`] found.
    fn apply_delta(&mut self, delta: &LinkDelta) {
        let index = match (&delta.after, &delta.before) {
            (Some(l), _) | (None, Some(l)) => l.index,
            (None, None) => return,
        };
        let at = self.links.binary_search_by_key(&index, |l| l.index);
        match (at, &delta.after) {
            (Ok(i), Some(l)) => self.links[i] = l.clone(),
            (Err(i), Some(l)) => self.links.insert(i, l.clone()),
            (Ok(i), None) => {
                self.links.remove(i);
            }
            (Err(_), None) => {}
        }
    }

    fn get(&self, index: u32) -> Option<&Link> {
        let at = self.links.binary_search_by_key(&index, |l| l.index).ok()?;
        self.links.get(at)
    }
}

/// Subscribes to link events, reads the links once into the table it
/// returns, and starts the thread that sends every later event on the
/// returned channel. The thread ends when the receiver is gone.
pub(crate) fn spawn_link_watcher() -> Result<(LinkTable, mpsc::UnboundedReceiver<LinkUpdate>)> {
    // Subscribe before the first read so no change can fall between them.
    let monitor = LinkMonitor::current()?;
    let handle = Handle::current()?;
    let table = LinkTable::new(handle.list_links()?);
    let (tx, rx) = mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new()
        .name("link-events".into())
        .spawn(move || watch_links(monitor, handle, tx));
    if let Err(e) = spawned {
        return Err(crate::error::Error::Task(format!(
            "starting the link event thread: {e}"
        )));
    }
    Ok((table, rx))
}

fn watch_links(monitor: LinkMonitor, handle: Handle, tx: mpsc::UnboundedSender<LinkUpdate>) {
    loop {
        let update = match monitor.recv() {
            Ok(events) if events.contains(&LinkEvent::Overrun) => {
                warn!("link events were lost; re-reading all links");
                resync(&handle, &tx)
            }
            Ok(events) if events.is_empty() => continue,
            Ok(events) => Some(LinkUpdate::Events(events)),
            Err(e) => {
                // What the socket held may be lost: read everything again.
                error!(error = %e, "reading link events");
                std::thread::sleep(ERROR_PAUSE);
                resync(&handle, &tx)
            }
        };
        let Some(update) = update else {
            return;
        };
        if tx.send(update).is_err() {
            return;
        }
    }
}

/// Reads every link again, retrying until it works; `None` when the
/// daemon is gone meanwhile.
fn resync(handle: &Handle, tx: &mpsc::UnboundedSender<LinkUpdate>) -> Option<LinkUpdate> {
    loop {
        match handle.list_links() {
            Ok(links) => return Some(LinkUpdate::Resync(links)),
            Err(e) => {
                error!(error = %e, "listing links");
                if tx.is_closed() {
                    return None;
                }
                std::thread::sleep(ERROR_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, flags: u32) -> Link {
        Link {
            index,
            name: name.into(),
            flags,
            ..Default::default()
        }
    }

    #[test]
    fn events_are_applied_and_only_real_changes_reported() {
        let mut t = LinkTable::new(vec![link(3, "eth1", 1), link(1, "lo", 9)]);
        assert_eq!(t.links()[0].name, "lo", "ifindex order");
        // A message that says what the table knows changes nothing.
        assert_eq!(t.apply(&LinkEvent::Changed(link(3, "eth1", 1))), None);
        let down = t.apply(&LinkEvent::Changed(link(3, "eth1", 0))).unwrap();
        assert_eq!(down.before, Some(link(3, "eth1", 1)));
        assert_eq!(down.after, Some(link(3, "eth1", 0)));
        let new = t.apply(&LinkEvent::Changed(link(2, "veth0", 0))).unwrap();
        assert_eq!(new.before, None);
        let gone = t.apply(&LinkEvent::Removed(link(1, "lo", 9))).unwrap();
        assert_eq!(gone.after, None);
        // A removal of a link the table never had changes nothing.
        assert_eq!(t.apply(&LinkEvent::Removed(link(7, "x", 0))), None);
        assert_eq!(t.apply(&LinkEvent::Overrun), None);
        let names: Vec<_> = t.links().iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["veth0", "eth1"]);
        assert_eq!(t.by_name("eth1"), Some(&link(3, "eth1", 0)));
    }

    #[test]
    fn a_rename_is_one_change_of_both_names() {
        let mut t = LinkTable::new(vec![link(4, "eth1", 1)]);
        let d = t.apply(&LinkEvent::Changed(link(4, "uplink", 1))).unwrap();
        let names: Vec<_> = d.states().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["eth1", "uplink"]);
        assert_eq!(t.by_name("eth1"), None);
        assert_eq!(t.links().len(), 1);
    }
}
