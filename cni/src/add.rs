//! ADD: hand the device plugin's macvtap over to the pod.
//!
//! The device is the NetConf's `deviceID`, which the kubelet must have
//! allocated to the pod (`crate::podresources`), or without one a device
//! the pod holds through Dynamic Resource Allocation (`crate::dra`).
//!
//! Everything that can be checked is checked before the first change. After
//! the link has moved, any failure undoes every change: IPAM gets a DEL and
//! the link goes back to the host namespace under its `mvt…` name, down and
//! with its old MAC and MTU, so that a retry starts from the same state.

use crate::config::NetConf;
use crate::dra;
use crate::env::{CniEnv, Command};
use crate::error::{CODE_IPAM_NO_ERROR_JSON, Error, Result};
use crate::give_back::{back_with_index, host_name_alias};
use crate::ipam;
use crate::podresources;
use crate::result::{CniResult, Interface, parse_cidr};
use crate::settings::NodeSettings;
use crate::tap;
use macvtap_link::link::format_mac;
use macvtap_link::{
    DeviceLinkName, Kernel, Link, LinkChange, Links, Netns, link_name_for_device, parse_link_name,
};
use nix::errno::Errno;
use std::net::IpAddr;
use tracing::{info, warn};

/// Runs ADD against `kernel` ([`macvtap_link::Linux`] in the binary, the
/// fake in unit tests) and returns the result to print.
pub(crate) fn add(
    kernel: &dyn Kernel,
    env: &CniEnv,
    conf: &NetConf,
    settings: &NodeSettings,
    stdin: &[u8],
) -> Result<CniResult> {
    let mac = conf.resolve_mac(&env.args)?;
    let prev = conf
        .prev_result
        .as_ref()
        .map(|v| CniResult::from_value(v, "prevResult"))
        .transpose()?;
    let ipam_type = conf.ipam_type()?;
    if let Some(t) = &ipam_type {
        ipam::find_plugin(env, t)?;
    }
    // With a deviceID, the kubelet must have allocated it to the pod;
    // without one, the pod's devices allocated through DRA are the
    // candidates (one List either way).
    let dra = if conf.device_id.is_empty() {
        Some(dra::candidates(env, conf, settings)?)
    } else {
        podresources::check_ownership(env, conf, settings)?;
        None
    };

    let host_ns = kernel.current_netns()?;
    let host = kernel.links(None)?;
    let device_id = match &dra {
        Some(candidates) => dra::pick(candidates, host.as_ref(), &conf.name)?,
        None => conf.device_id.clone(),
    };
    let link = find_device_link(host.as_ref(), &device_id)?;
    if !link.is_macvtap() {
        return Err(Error::NotMacvtap {
            device_id: device_id.clone(),
            link: link.name.clone(),
            kind: link
                .kind
                .clone()
                .unwrap_or_else(|| "physical NIC".to_string()),
        });
    }
    check_mtu(host.as_ref(), &link, conf.mtu)?;
    let pod_ns = env.open_netns(kernel)?;
    let pod = kernel.links(Some(&pod_ns))?;

    let undo = Undo {
        env,
        stdin,
        host_ns: &host_ns,
        host: host.as_ref(),
        pod: pod.as_ref(),
        orig: &link,
    };
    if let Err(e) = host.set_link_ns(link.index, &link.name, &pod_ns, &env.ifname) {
        let cause = explain_move_error(e, &link, env);
        // Older kernels move first and rename second: a failed rename (the
        // name is taken in the pod) leaves the link in the pod under its old
        // name, with a new ifindex if its own was taken. Bring it back.
        let stranded = pod
            .get_link(&link.name)?
            .filter(|l| undo.is_ours(l))
            .map(|l| InPod {
                index: l.index,
                name: l.name,
            });
        let Some(stranded) = stranded else {
            return Err(cause);
        };
        warn!(error = %cause, link = %link.name, "move half done; moving the link back");
        return Err(undo.run(cause, Some(&stranded), None));
    }
    info!(
        pod = %env.args.pod_ref(),
        network = %conf.name,
        device_id = %device_id,
        dra = dra.is_some(),
        link = %link.name,
        ifindex = link.index,
        ifname = %env.ifname,
        netns = %env.netns,
        "moved macvtap into the pod"
    );

    let mut progress = Progress {
        in_pod: Some(InPod {
            index: link.index,
            name: env.ifname.clone(),
        }),
        ipam_added: None,
    };
    let target = Target {
        kernel,
        pod_ns: &pod_ns,
        pod: pod.as_ref(),
        link: &link,
        host: host.as_ref(),
    };
    match configure(
        env,
        conf,
        stdin,
        &target,
        mac,
        ipam_type.as_deref(),
        &mut progress,
    ) {
        Ok(ours) => Ok(merge(prev, ours)),
        Err(cause) => {
            warn!(error = %cause, "ADD failed after moving the link; rolling back");
            Err(undo.run(
                cause,
                progress.in_pod.as_ref(),
                progress.ipam_added.as_deref(),
            ))
        }
    }
}

/// The interface, addresses and routes this plugin adds.
struct Ours {
    interface: Interface,
    ipam: Option<CniResult>,
}

/// Where our macvtap is in the pod: the rollback acts on this link and on no
/// other, even when the kernel gave it another ifindex than asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InPod {
    index: u32,
    name: String,
}

/// What ADD has done after the move, for the rollback.
struct Progress {
    /// Our link in the pod (`None` when it vanished from there).
    in_pod: Option<InPod>,
    /// The IPAM plugin whose ADD succeeded.
    ipam_added: Option<String>,
}

/// The pod side ADD configures.
struct Target<'a> {
    kernel: &'a dyn Kernel,
    pod_ns: &'a Netns,
    pod: &'a dyn Links,
    /// The link as it was on the host before the move.
    link: &'a Link,
    /// The host's links, where the lower NIC is (looked up only to explain
    /// an error).
    host: &'a dyn Links,
}

fn configure(
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    target: &Target<'_>,
    mac: Option<[u8; 6]>,
    ipam_type: Option<&str>,
    progress: &mut Progress,
) -> Result<Ours> {
    let Target {
        kernel,
        pod_ns,
        pod,
        link,
        host,
    } = *target;
    let Some(moved) = pod.get_link(&env.ifname)? else {
        progress.in_pod = None;
        return Err(Error::IfindexChanged(format!(
            "link {} vanished while moving into {} as {}",
            link.name, env.netns, env.ifname
        )));
    };
    // From here on the rollback acts on the link that actually moved.
    progress.in_pod = Some(InPod {
        index: moved.index,
        name: moved.name.clone(),
    });
    if moved.index != link.index {
        return Err(Error::IfindexChanged(format!(
            "link {} had ifindex {} but has {} in {}; /dev/tap{} no longer names it (this \
             kernel ignores the ifindex asked for when moving a link, and the index is taken \
             in the pod)",
            link.name, link.index, moved.index, env.netns, link.index
        )));
    }
    let change = LinkChange {
        mtu: (conf.mtu > 0).then_some(conf.mtu),
        mac,
        up: Some(true),
        promisc: Some(conf.promisc_mode),
        name: None,
        // DEL gives the link back under this name, even without deviceID.
        alias: Some(host_name_alias(&link.name)),
    };
    if ipam_type.is_none() {
        silence(kernel, pod_ns, &env.ifname)?;
    }
    pod.set_link(moved.index, &env.ifname, &change)
        .map_err(|e| explain_set_error(e, &change, &env.ifname, host, link))?;
    let node = tap::hand_over(
        kernel,
        pod_ns,
        &env.ifname,
        moved.index,
        conf.owner(),
        conf.group(),
    )?;
    info!(node = %node.display(), owner = conf.owner(), group = conf.group(), "gave tap device to the VM user");

    let ipam = match ipam_type {
        Some(plugin) => {
            let raw = ipam::exec(env, plugin, Command::Add, stdin)?.ok_or_else(|| Error::Ipam {
                plugin: plugin.to_string(),
                code: CODE_IPAM_NO_ERROR_JSON,
                msg: "ADD printed no result".into(),
            })?;
            progress.ipam_added = Some(plugin.to_string());
            let result =
                CniResult::from_value(&raw, &format!("the result of IPAM plugin {plugin}"))?;
            apply_ipam(pod, moved.index, &result)?;
            Some(result)
        }
        None => None,
    };

    // The result reports the link as the kernel has it now.
    let now = pod.get_link(&env.ifname)?.unwrap_or(moved);
    Ok(Ours {
        interface: Interface {
            name: env.ifname.clone(),
            mac: Some(now.mac_string()),
            mtu: Some(now.mtu),
            sandbox: Some(env.netns.clone()),
            other: Default::default(),
        },
        ipam,
    })
}

/// Keeps the pod-side link from sending anything of its own once it is up:
/// no IPv6 link-local address, so no DAD, no router solicitations, no MLD
/// reports, all of which would leave with the VM's MAC before any guest
/// runs. During a live migration the target pod's link comes up while the
/// VM still runs on the source, and such frames teach the switches that the
/// VM lives on the target too early. Only without IPAM: the link then needs
/// no address (the guest has its own stack on the tap), and with IPAM the
/// addresses it asked for must work.
fn silence(kernel: &dyn Kernel, pod_ns: &Netns, ifname: &str) -> Result<()> {
    let key = format!("net/ipv6/conf/{ifname}/disable_ipv6");
    match kernel.write_sysctl(pod_ns, &key, "1") {
        // A kernel without IPv6 sends no IPv6 either.
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(()),
        other => Ok(other?),
    }
}

/// The lower NIC of `link`, when it is in the host namespace.
fn lower_of(host: &dyn Links, link: &Link) -> Result<Option<Link>> {
    match link.lower_index {
        Some(index) if !link.lower_in_other_netns => Ok(host.get_link_by_index(index)?),
        _ => Ok(None),
    }
}

/// Refuses an MTU above the lower NIC's (no look-up when no MTU is asked).
fn check_mtu(host: &dyn Links, link: &Link, mtu: u32) -> Result<()> {
    if mtu == 0 {
        return Ok(());
    }
    match lower_of(host, link)? {
        Some(lower) if mtu > lower.mtu => Err(Error::MtuTooLarge {
            mtu,
            lower_mtu: lower.mtu,
            lower: lower.name,
            link: link.name.clone(),
        }),
        _ => Ok(()),
    }
}

fn explain_move_error(e: macvtap_link::Error, link: &Link, env: &CniEnv) -> Error {
    match e.errno() {
        Some(Errno::EBUSY) => Error::IfindexChanged(format!(
            "cannot move link {} into {}: its ifindex {} is already taken there, and a new \
             ifindex would orphan /dev/tap{} that the kubelet gave the pod (EBUSY)",
            link.name, env.netns, link.index, link.index
        )),
        Some(Errno::EEXIST) => Error::InvalidConfig(format!(
            "cannot move link {} into {}: an interface named {} already exists there (EEXIST)",
            link.name, env.netns, env.ifname
        )),
        _ => Error::Link(e),
    }
}

/// A taken MAC names the NIC (of `link`, looked up in `host`) whose other
/// macvtap holds it.
fn explain_set_error(
    e: macvtap_link::Error,
    change: &LinkChange,
    ifname: &str,
    host: &dyn Links,
    link: &Link,
) -> Error {
    match (e.errno(), change.mac) {
        (Some(Errno::EADDRINUSE), Some(mac)) => Error::MacInUse {
            mac: format_mac(&mac),
            ifname: ifname.to_string(),
            lower: match lower_of(host, link) {
                Ok(Some(lower)) => lower.name,
                _ => "the same lower NIC".to_string(),
            },
        },
        _ => Error::Link(e),
    }
}

/// Puts IPAM's addresses and routes on the link. A route without a gateway
/// uses the gateway of the first address of its family that has one, as the
/// reference plugins do.
fn apply_ipam(pod: &dyn Links, index: u32, result: &CniResult) -> Result<()> {
    for ip in &result.ips {
        let (addr, prefix) = parse_cidr(&ip.address).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "the IPAM plugin returned address {:?}, which is not an address/prefix",
                ip.address
            ))
        })?;
        pod.add_addr(index, addr, prefix)?;
    }
    let gateway_for = |v4: bool| -> Option<IpAddr> {
        result
            .ips
            .iter()
            .filter_map(|ip| ip.gateway)
            .find(|g| g.is_ipv4() == v4)
    };
    for route in &result.routes {
        let (dst, prefix) = parse_cidr(&route.dst).ok_or_else(|| {
            Error::InvalidConfig(format!(
                "the IPAM plugin returned route {:?}, which is not an address/prefix",
                route.dst
            ))
        })?;
        let gw = route.gw.or_else(|| gateway_for(dst.is_ipv4()));
        pod.add_route(index, dst, prefix, gw)?;
    }
    Ok(())
}

/// What is needed to undo an ADD whose link has moved into the pod.
struct Undo<'a> {
    env: &'a CniEnv,
    stdin: &'a [u8],
    host_ns: &'a Netns,
    host: &'a dyn Links,
    pod: &'a dyn Links,
    /// The link as it was on the host before the move.
    orig: &'a Link,
}

impl Undo<'_> {
    /// Whether `l` is the macvtap ADD moved: a macvtap on the same lower
    /// NIC (name and index are checked by the caller).
    fn is_ours(&self, l: &Link) -> bool {
        l.is_macvtap() && l.lower_index == self.orig.lower_index
    }

    /// Releases IPAM (when `ipam_added`), brings our link (`in_pod`) back to
    /// the host as it was, and returns the error to report.
    fn run(&self, cause: Error, in_pod: Option<&InPod>, ipam_added: Option<&str>) -> Error {
        let problems = self.undo(in_pod, ipam_added);
        if !problems.is_empty() {
            Error::RollbackFailed {
                cause: Box::new(cause),
                rollback: problems.join("; "),
            }
        } else if cause.is_transient() {
            Error::TryAgain(Box::new(cause))
        } else {
            cause
        }
    }

    fn undo(&self, in_pod: Option<&InPod>, ipam_added: Option<&str>) -> Vec<String> {
        let orig = self.orig;
        let mut problems = Vec::new();
        if let Some(plugin) = ipam_added {
            if let Err(e) = ipam::exec(self.env, plugin, Command::Del, self.stdin) {
                problems.push(format!("releasing IPAM: {e}"));
            }
        }
        let Some(at) = in_pod else {
            problems.push(format!(
                "link {} is no longer in {}, so it cannot be moved back",
                orig.name, self.env.netns
            ));
            return problems;
        };
        // Re-read before touching anything: act only on our own macvtap.
        match self.pod.get_link_by_index(at.index) {
            Ok(Some(l)) if l.name == at.name && self.is_ours(&l) => {}
            Ok(Some(other)) => {
                problems.push(format!(
                    "ifindex {} in {} now belongs to {} (not our macvtap {}); left it alone",
                    at.index, self.env.netns, other.name, at.name
                ));
                return problems;
            }
            Ok(None) => {
                problems.push(format!(
                    "link {} vanished from {}, so it cannot be moved back",
                    at.name, self.env.netns
                ));
                return problems;
            }
            Err(e) => {
                problems.push(e.to_string());
                return problems;
            }
        }
        // Restore in the pod, before the move: whatever stops the rollback
        // after it (a failure, or the process killed), the host never holds
        // the link promiscuous or with this pod's MAC or MTU. Down first,
        // then MAC and MTU, as DEL does (a MAC change on an up macvtap
        // costs an RCU grace period).
        let down = LinkChange {
            up: Some(false),
            promisc: Some(orig.is_promisc()),
            ..Default::default()
        };
        let restore = LinkChange {
            mtu: Some(orig.mtu),
            mac: orig.mac,
            ..Default::default()
        };
        for change in [&down, &restore] {
            if let Err(e) = self.pod.set_link(at.index, &at.name, change) {
                problems.push(e.to_string());
            }
        }
        if let Err(e) =
            self.pod
                .set_link_ns_at(at.index, &at.name, self.host_ns, &orig.name, orig.index)
        {
            problems.push(e.to_string());
            return problems;
        }
        let back = match back_with_index(self.host, &orig.name, orig.index, &self.env.netns) {
            Ok(Some(back)) => back,
            Ok(None) => return problems,
            Err(e) => {
                problems.push(e.to_string());
                return problems;
            }
        };
        if orig.is_up() {
            let up = LinkChange {
                up: Some(true),
                ..Default::default()
            };
            if let Err(e) = self.host.set_link(back.index, &orig.name, &up) {
                problems.push(e.to_string());
            }
        }
        if problems.is_empty() {
            info!(link = %orig.name, "rolled back: the link is in the host namespace again");
        }
        problems
    }
}

fn merge(prev: Option<CniResult>, ours: Ours) -> CniResult {
    let mut result = prev.unwrap_or_default();
    let index = result.interfaces.len();
    result.interfaces.push(ours.interface);
    if let Some(ipam) = ours.ipam {
        for mut ip in ipam.ips {
            ip.interface = Some(index);
            result.ips.push(ip);
        }
        result.routes.extend(ipam.routes);
        if ipam.dns.as_object().is_some_and(|o| !o.is_empty()) {
            result.dns = ipam.dns;
        }
    }
    result
}

/// The host link of `device_id`: the `mvt…` name this device plugin (and the
/// Go project's unreleased main) gives, else the device ID itself, the name
/// the Go device plugin's last release (v0.13.1) gave. A pod allocated by the
/// old plugin during a rolling replacement brings such a device here. When
/// both exist the `mvt…` link is taken: it is the one this node's device
/// plugin made for the current allocation.
fn find_device_link(host: &dyn Links, device_id: &str) -> Result<Link> {
    let ours = link_name_for_device(device_id);
    let go_era = matches!(
        parse_link_name(device_id),
        Some(DeviceLinkName::GoEra { .. })
    )
    .then_some(device_id);
    let found = host.get_link(&ours)?;
    let older = match go_era {
        Some(name) => host.get_link(name)?,
        None => None,
    };
    match (found, older) {
        (Some(link), Some(old)) => {
            info!(
                device_id,
                link = %link.name,
                other = %old.name,
                "both this plugin's link and the Go device plugin's link for the device exist: \
                 handing over {} and leaving {} on the host (the device plugin removes it once \
                 the device is free)",
                link.name,
                old.name
            );
            Ok(link)
        }
        (Some(link), None) => Ok(link),
        (None, Some(old)) => {
            info!(device_id, link = %old.name, "handing over a link named after its device ID, as the Go device plugin v0.13.1 named it");
            Ok(old)
        }
        (None, None) => Err(Error::DeviceLinkMissing {
            device_id: device_id.to_string(),
            link: match go_era {
                Some(name) => {
                    format!("{ours} (or {name}, as the Go device plugin v0.13.1 named it)")
                }
                None => ours,
            },
        }),
    }
}
