//! The node's links as a watch channel, refreshed on netlink link events.
//!
//! A dedicated thread blocks on a `RTNLGRP_LINK` subscription (see
//! [`macvtap_link::monitor`]) and re-reads the link list after every batch of
//! events, so health and auto-discovery react within milliseconds and nothing
//! polls. The daemon never changes namespace, so the thread's sockets belong
//! to the namespace the daemon was started in (the host's).

use crate::error::Result;
use macvtap_link::monitor::{LinkEvent, LinkMonitor};
use macvtap_link::{Handle, Link, Links};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, error, warn};

/// How long to pause after a failed read of link events, so a lasting
/// error does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

/// A snapshot of every link of the namespace, as the link watcher last read
/// it (not to be confused with [`macvtap_link::Links`], a namespace's link
/// operations).
pub type LinkSnapshot = Arc<Vec<Link>>;

/// Subscribes to link events, reads the links once, and starts the thread
/// that keeps the returned channel current. The thread ends when every
/// receiver is gone.
pub fn spawn_link_watcher() -> Result<watch::Receiver<LinkSnapshot>> {
    // Subscribe before the first read so no change can fall between them.
    let monitor = LinkMonitor::current()?;
    let handle = Handle::current()?;
    let (tx, rx) = watch::channel(Arc::new(handle.list_links()?));
    let spawned = std::thread::Builder::new()
        .name("link-events".into())
        .spawn(move || watch_links(monitor, handle, tx));
    if let Err(e) = spawned {
        return Err(crate::error::Error::Task(format!(
            "starting the link event thread: {e}"
        )));
    }
    Ok(rx)
}

fn watch_links(monitor: LinkMonitor, handle: Handle, tx: watch::Sender<LinkSnapshot>) {
    loop {
        match monitor.recv() {
            Ok(events) => {
                for ev in &events {
                    match ev {
                        LinkEvent::Changed { name, flags, .. } => {
                            debug!(ifname = %name, flags, "link changed")
                        }
                        LinkEvent::Removed { name, .. } => debug!(ifname = %name, "link removed"),
                        LinkEvent::Overrun => warn!("link events were lost; re-reading all links"),
                    }
                }
            }
            Err(e) => {
                error!(error = %e, "reading link events");
                std::thread::sleep(ERROR_PAUSE);
            }
        }
        match handle.list_links() {
            Ok(links) => {
                tx.send_if_modified(|cur| {
                    if **cur == links {
                        false
                    } else {
                        *cur = Arc::new(links);
                        true
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
            Err(e) => error!(error = %e, "listing links"),
        }
    }
}
