//! DEL: release IPAM and give the pod's macvtap back to the host namespace.
//!
//! The kubelet allocates a pod's devices once and hands the same `/dev/tapN`
//! to every container it creates for the pod, but a runtime re-creates a
//! sandbox (new network namespace, DEL first, then ADD again) whenever a
//! later step of its set-up fails. Deleting the link would strand the pod:
//! its retried ADD would find no link, for good. So DEL moves the macvtap
//! back to the host, down, under the name it had there and with its ifindex,
//! where the retried ADD finds it again; the device plugin removes it once no
//! pod holds its device. When that is not possible (the ifindex or the name
//! is taken on the host, or DEL cannot tell the name) the link is deleted,
//! and the device plugin re-creates it if its pod still holds the device.
//! The name and ifindex rule is ADD's rollback's too: `give_back.rs`.
//! Without a `deviceID` (a device ADD took through DRA), the name comes from
//! the pod link's alias alone, which the pod can rewrite: the kubelet must
//! confirm that the pod holds that link's device first.
//!
//! Idempotent: a missing namespace, a missing link or a second DEL all
//! succeed.

use crate::config::NetConf;
use crate::env::{CniEnv, Command};
use crate::error::{Error, Result};
use crate::give_back::{back_with_index, host_name};
use crate::ipam;
use crate::podresources::{self, LinkHolding};
use crate::settings::NodeSettings;
use macvtap_link::{Kernel, Link, LinkChange, Links, Netns, PodResourcesCheck};
use nix::errno::Errno;
use std::path::Path;
use tracing::{info, warn};

/// Runs DEL (`settings` for the check of a host name read from the alias
/// without a `deviceID`, [`alias_confirmed`]).
pub(crate) fn del(
    kernel: &dyn Kernel,
    env: &CniEnv,
    conf: &NetConf,
    settings: &NodeSettings,
    stdin: &[u8],
) -> Result<()> {
    let mut problems: Vec<Error> = Vec::new();
    if let Some(plugin) = conf.ipam_type()? {
        if let Err(e) = ipam::exec(env, &plugin, Command::Del, stdin) {
            problems.push(e);
        }
    }
    if let Err(e) = release_link(kernel, env, conf, settings) {
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

fn release_link(
    kernel: &dyn Kernel,
    env: &CniEnv,
    conf: &NetConf,
    settings: &NodeSettings,
) -> Result<()> {
    if env.netns.is_empty() {
        info!(ifname = %env.ifname, "no CNI_NETNS: the pod namespace is gone, and the link with it");
        return Ok(());
    }
    let pod_ns = match kernel.open_netns(Path::new(&env.netns)) {
        Ok(ns) => ns,
        Err(e) if e.errno() == Some(Errno::ENOENT) => {
            info!(netns = %env.netns, "network namespace is gone, and the link with it");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let pod = kernel.links(Some(&pod_ns))?;
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
    let Some(host_name) = host_name(&link, &conf.device_id) else {
        warn!(
            ifname = %env.ifname,
            netns = %env.netns,
            "the link carries no host name (added by another plugin version) and the config \
             has no deviceID: deleting it instead of giving it back"
        );
        return delete(pod.as_ref(), &link, env);
    };
    if conf.device_id.is_empty() && !alias_confirmed(env, settings, &host_name) {
        return delete(pod.as_ref(), &link, env);
    }
    let host_ns = kernel.current_netns()?;
    let host = kernel.links(None)?;
    give_back(
        env,
        pod.as_ref(),
        &host_ns,
        host.as_ref(),
        &link,
        &host_name,
    )
}

/// Whether a link may go back under `host_name`, read from its alias
/// without a `deviceID` to agree with (always so after an ADD that took a
/// DRA device, since Multus runs DEL with the config it ran ADD with). The
/// pod can rewrite its link's alias, and a link given back under another
/// device's name would later be handed to that device's pod, so the
/// kubelet must say the pod holds the device of that link. When it says
/// the pod does not (the pod may be gone), the link is deleted, as it
/// would be at the pod's end anyway; when it cannot be asked,
/// `podResourcesCheck` decides: `enforce` deletes (the device plugin
/// re-creates a lost link while its pod holds the device), `warn` gives it
/// back as before this check, with a warning.
fn alias_confirmed(env: &CniEnv, settings: &NodeSettings, host_name: &str) -> bool {
    match podresources::pod_holds_link(env, settings, host_name) {
        LinkHolding::Held => true,
        LinkHolding::NotHeld(why) => {
            warn!(
                ifname = %env.ifname,
                host_name,
                "the link's alias names {host_name}, and {why}: deleting it instead of giving \
                 it back"
            );
            false
        }
        LinkHolding::Unknown(why) => match settings.pod_resources_check {
            PodResourcesCheck::Enforce => {
                warn!(
                    ifname = %env.ifname,
                    host_name,
                    "cannot check that the pod holds the device of {host_name}, the name in \
                     the link's alias: {why}; deleting the link instead of giving it back \
                     (podResourcesCheck is enforce)"
                );
                false
            }
            PodResourcesCheck::Warn => {
                warn!(
                    ifname = %env.ifname,
                    host_name,
                    "cannot check that the pod holds the device of {host_name}, the name in \
                     the link's alias: {why}; giving it back (podResourcesCheck is warn)"
                );
                true
            }
        },
    }
}

/// Resets the link (down, a fresh random MAC, no promiscuity) and moves it
/// back to the host as `host_name`, keeping its ifindex; deletes it instead
/// when that cannot be done cleanly.
fn give_back(
    env: &CniEnv,
    pod: &dyn Links,
    host_ns: &Netns,
    host: &dyn Links,
    link: &Link,
    host_name: &str,
) -> Result<()> {
    if let Some(other) = host.get_link_by_index(link.index)? {
        warn!(
            ifname = %env.ifname,
            ifindex = link.index,
            other = %other.name,
            "the link's ifindex is taken in the host namespace, so it cannot go back with its \
             /dev/tap{}: deleting it instead (the device plugin re-creates it while its pod \
             holds the device)",
            link.index
        );
        return delete(pod, link, env);
    }
    if host.get_link(host_name)?.is_some() {
        warn!(
            ifname = %env.ifname,
            host_name,
            "a link of that name already exists in the host namespace: deleting the pod's link \
             instead of giving it back"
        );
        return delete(pod, link, env);
    }
    // Reset first, in the pod: whatever fails after the move, the host never
    // holds a link with this pod's MAC or promiscuity. Down first, then the
    // MAC: the kernel applies a MAC before the flags of one message, and a
    // MAC change on an up macvtap costs an RCU grace period (about 15 ms
    // here) where on a down one it costs nothing; the move then has no link
    // to close.
    let down = LinkChange {
        promisc: Some(false),
        up: Some(false),
        ..Default::default()
    };
    let fresh_mac = LinkChange {
        // The next pod this device goes to must not inherit this pod's MAC.
        mac: Some(random_mac()?),
        ..Default::default()
    };
    for change in [&down, &fresh_mac] {
        if let Err(e) = pod.set_link(link.index, &env.ifname, change) {
            warn!(error = %e, ifname = %env.ifname, "cannot reset the link before giving it back; deleting it");
            return delete(pod, link, env);
        }
    }
    if let Err(e) = pod.set_link_ns(link.index, &env.ifname, host_ns, host_name) {
        // Older kernels move before they rename: a failed rename leaves the
        // link in the host under its pod name (with a new ifindex if its own
        // was taken). Never leave it there; touch only our macvtap.
        if let Some(stranded) = host.get_link(&env.ifname)? {
            if stranded.is_macvtap() && stranded.lower_index == link.lower_index {
                warn!(error = %e, ifname = %env.ifname, "move half done; deleting the link in the host namespace");
                return delete(host, &stranded, env);
            }
        }
        warn!(error = %e, ifname = %env.ifname, "cannot give the link back; deleting it");
        return delete(pod, link, env);
    }
    let Some(back) = back_with_index(host, host_name, link.index, &env.netns)? else {
        return Ok(());
    };
    info!(
        ifname = %env.ifname,
        netns = %env.netns,
        host_name,
        ifindex = back.index,
        "gave the macvtap back to the host namespace (down, same ifindex)"
    );
    Ok(())
}

/// Deletes `link` through `handle`; a link already gone is success.
fn delete(handle: &dyn Links, link: &Link, env: &CniEnv) -> Result<()> {
    match handle.del_link(link.index, &link.name) {
        Ok(()) => {
            info!(ifname = %env.ifname, netns = %env.netns, link = %link.name, "deleted macvtap");
            Ok(())
        }
        Err(e) if e.errno() == Some(Errno::ENODEV) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A random locally administered unicast MAC.
fn random_mac() -> Result<[u8; 6]> {
    use std::io::Read;
    let mut mac = [0u8; 6];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut mac))
        .map_err(|source| Error::Io {
            what: "reading /dev/urandom for a new MAC".into(),
            source,
        })?;
    mac[0] = (mac[0] & 0xfe) | 0x02;
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_macs_are_local_unicast() {
        let mac = random_mac().unwrap();
        assert_eq!(mac[0] & 0x03, 0x02);
        assert_ne!(random_mac().unwrap(), mac);
    }
}
