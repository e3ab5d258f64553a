//! The daemon's network namespace on one kernel: the one handle that
//! Allocate, reclaim and heal do their kernel work through. The daemon
//! passes the real kernel ([`macvtap_link::Linux`]); unit tests pass the
//! fake one, so every decision runs without root.

use macvtap_link::{Kernel, Links, Netns, Result};
use std::fmt;

/// One network namespace on `kernel`: its links, and the namespace itself
/// for what is read from inside it (a macvtap's char device in sysfs) and
/// the tap nodes of its macvtaps.
pub struct Host<'k> {
    kernel: &'k dyn Kernel,
    netns: Netns,
    links: Box<dyn Links + Send + 'k>,
}

impl<'k> Host<'k> {
    /// The calling thread's namespace on `kernel`: the host's, since the
    /// daemon never changes namespace.
    pub fn current(kernel: &'k dyn Kernel) -> Result<Self> {
        Ok(Self {
            kernel,
            netns: kernel.current_netns()?,
            // A socket of the calling thread's own: no helper thread.
            links: kernel.links(None)?,
        })
    }

    /// Namespace `netns` on `kernel`, with a netlink socket opened inside it
    /// (from a helper thread).
    pub fn in_netns(kernel: &'k dyn Kernel, netns: Netns) -> Result<Self> {
        let links = kernel.links(Some(&netns))?;
        Ok(Self {
            kernel,
            netns,
            links,
        })
    }

    /// The kernel, for sysfs reads and tap nodes.
    pub fn kernel(&self) -> &'k dyn Kernel {
        self.kernel
    }

    /// The namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The namespace's links.
    pub fn links(&self) -> &dyn Links {
        self.links.as_ref()
    }
}

impl fmt::Debug for Host<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("netns", &self.netns.path())
            .finish_non_exhaustive()
    }
}
