//! The node's global addresses and default routes, kept current from
//! netlink notifications, for `spare` auto-discovery
//! ([`crate::core::nic::usage`]).
//!
//! A dedicated thread blocks on a subscription to the address and route
//! groups ([`macvtap_link::monitor::AddressRouteMonitor`], which drops the
//! notifications of routes other than default ones, such as the one some
//! network plugins add per pod). On each batch that touches a global
//! address or a default route it reads both again and sends what they are
//! now when that differs from what it sent last; link-local addresses,
//! which every new link gets, wake nothing. After lost notifications it
//! reads them again too.

use crate::core::nic::usage::Addressing;
use crate::error::{Error, Result};
use macvtap_link::Handle;
use macvtap_link::monitor::{AddressRouteEvent, AddressRouteMonitor};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::error;

/// How long to pause after a failed read, so a lasting error does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

/// Subscribes to address and route notifications, reads the addressing
/// once (returned), and starts the thread that sends each later change of
/// it on the returned channel. The thread ends when the receiver is gone.
pub(crate) fn spawn_addressing_watcher() -> Result<(Addressing, mpsc::UnboundedReceiver<Addressing>)>
{
    // Subscribe before the first read so no change can fall between them.
    let monitor = AddressRouteMonitor::current()?;
    let handle = Handle::current()?;
    let first = read(&handle)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let last = first.clone();
    std::thread::Builder::new()
        .name("address-events".into())
        .spawn(move || watch(monitor, handle, last, tx))
        .map_err(|e| Error::Task(format!("starting the address event thread: {e}")))?;
    Ok((first, rx))
}

/// The namespace's addressing as far as discovery looks at it.
fn read(handle: &Handle) -> Result<Addressing> {
    Ok(Addressing {
        addresses: handle.list_addresses()?,
        default_routes: handle.list_default_routes()?,
    }
    .relevant())
}

/// Whether a batch of notifications can change what [`read`] returns.
pub(crate) fn matters(events: &[AddressRouteEvent]) -> bool {
    events.iter().any(|e| match e {
        AddressRouteEvent::AddressAdded(a) | AddressRouteEvent::AddressRemoved(a) => a.global,
        AddressRouteEvent::DefaultRouteAdded(_)
        | AddressRouteEvent::DefaultRouteRemoved(_)
        | AddressRouteEvent::Overrun => true,
    })
}

fn watch(
    monitor: AddressRouteMonitor,
    handle: Handle,
    mut last: Addressing,
    tx: mpsc::UnboundedSender<Addressing>,
) {
    loop {
        match monitor.recv() {
            Ok(events) if !matters(&events) => continue,
            Ok(_) => {}
            Err(e) => {
                // What the socket held may be lost: read everything again.
                error!(error = %e, "reading address and route events");
                std::thread::sleep(ERROR_PAUSE);
            }
        }
        let now = loop {
            match read(&handle) {
                Ok(a) => break a,
                Err(e) => {
                    error!(error = %e, "reading the node's addresses and default routes");
                    if tx.is_closed() {
                        return;
                    }
                    std::thread::sleep(ERROR_PAUSE);
                }
            }
        };
        if now != last {
            last = now.clone();
            if tx.send(now).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::{Address, DefaultRoute};

    #[test]
    fn link_local_addresses_wake_nothing() {
        let addr = |global: bool| Address {
            index: 2,
            ip: "fe80::1".parse().unwrap(),
            prefix_len: 64,
            global,
        };
        assert!(!matters(&[
            AddressRouteEvent::AddressAdded(addr(false)),
            AddressRouteEvent::AddressRemoved(addr(false)),
        ]));
        assert!(matters(&[
            AddressRouteEvent::AddressAdded(addr(false)),
            AddressRouteEvent::AddressAdded(addr(true)),
        ]));
        assert!(matters(&[AddressRouteEvent::Overrun]));
        assert!(matters(&[AddressRouteEvent::DefaultRouteRemoved(
            DefaultRoute {
                ipv6: true,
                table: 254,
                oifs: vec![2],
                nexthop_id: None,
            }
        )]));
    }
}
