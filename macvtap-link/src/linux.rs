//! The real kernel behind [`Kernel`]: namespaces, a [`Handle`] per
//! namespace, sysctls and tap nodes, each method forwarding to the code the
//! root tests prove against the kernel.

use crate::error::{Error, Result};
use crate::kernel::{Kernel, Links};
use crate::netlink::Handle;
use crate::netns::Netns;
use crate::tapdev::{self, TapNode};
use std::path::Path;
use std::time::Duration;

/// The real kernel: every method forwards to [`Handle`], [`Netns`] and
/// [`tapdev`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

impl Kernel for Linux {
    fn current_netns(&self) -> Result<Netns> {
        Netns::current()
    }

    fn open_netns(&self, path: &Path) -> Result<Netns> {
        Netns::open(path)
    }

    fn links<'a>(&'a self, netns: Option<&Netns>) -> Result<Box<dyn Links + Send + 'a>> {
        Ok(Box::new(match netns {
            None => Handle::current()?,
            Some(ns) => Handle::in_netns(ns)?,
        }))
    }

    fn write_sysctl(&self, netns: &Netns, key: &str, value: &str) -> Result<()> {
        let path = Path::new("/proc/sys").join(key);
        let written = netns.run(|| Ok(std::fs::write(&path, value)))?;
        written.map_err(|source| Error::Sysctl {
            key: key.to_string(),
            netns: netns.path().to_path_buf(),
            source,
        })
    }

    fn tap_device(&self, netns: &Netns, ifname: &str) -> Result<(u64, u64)> {
        tapdev::tap_dev_in_netns(netns, ifname)
    }

    fn open_tap_node(&self, path: &Path, dev: (u64, u64), wait: Duration) -> Result<TapNode> {
        tapdev::open_tap_node(path, dev, wait).map(|file| TapNode::opened(path, file))
    }

    fn tap_node(&self, path: &Path) -> Result<Option<(u64, u64)>> {
        tapdev::tap_node_dev(path)
    }

    fn chown_tap_node(&self, node: &TapNode, owner: u32, group: u32) -> Result<()> {
        node.chown(owner, group)
    }
}
