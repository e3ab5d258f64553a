//! DEL: release IPAM and delete the pod's macvtap. Idempotent: a missing
//! namespace, a missing link or a second DEL all succeed.

use crate::config::NetConf;
use crate::env::{CniEnv, Command};
use crate::error::{Error, Result};
use crate::ipam;
use macvtap_link::{Handle, Netns};
use nix::errno::Errno;
use tracing::{info, warn};

/// Runs DEL.
pub fn del(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let mut problems: Vec<Error> = Vec::new();
    if let Some(plugin) = conf.ipam_type()? {
        if let Err(e) = ipam::exec(env, &plugin, Command::Del, stdin) {
            problems.push(e);
        }
    }
    if let Err(e) = del_link(env) {
        problems.push(e);
    }
    match problems.len() {
        0 => Ok(()),
        1 => Err(problems.remove(0)),
        _ => Err(Error::RollbackFailed {
            cause: Box::new(problems.remove(0)),
            rollback: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

fn del_link(env: &CniEnv) -> Result<()> {
    if env.netns.is_empty() {
        info!(ifname = %env.ifname, "no CNI_NETNS: the pod namespace is gone, and the link with it");
        return Ok(());
    }
    let pod_ns = match Netns::open(&env.netns) {
        Ok(ns) => ns,
        Err(e) if e.errno() == Some(Errno::ENOENT) => {
            info!(netns = %env.netns, "network namespace is gone, and the link with it");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let pod = Handle::in_netns(&pod_ns)?;
    let Some(link) = pod.get_link(&env.ifname)? else {
        info!(ifname = %env.ifname, netns = %env.netns, "link already gone");
        return Ok(());
    };
    if !link.is_macvtap() {
        warn!(
            ifname = %env.ifname,
            netns = %env.netns,
            kind = link.kind.as_deref().unwrap_or("physical"),
            "not a macvtap; leaving it alone"
        );
        return Ok(());
    }
    match pod.del_link(link.index, &env.ifname) {
        Ok(()) => {
            info!(ifname = %env.ifname, netns = %env.netns, "deleted macvtap");
            Ok(())
        }
        Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
