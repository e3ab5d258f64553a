//! CHECK: verify that the pod's link is still as ADD left it.

use crate::config::NetConf;
use crate::env::{CniEnv, Command};
use crate::error::{Error, Result};
use crate::ipam;
use crate::result::{CniResult, parse_cidr};
use crate::version::Version;
use macvtap_link::Kernel;

/// Runs CHECK (cniVersion 0.4.0 and later).
pub(crate) fn check(kernel: &dyn Kernel, env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    conf.version.require(Version::V0_4_0, "CHECK")?;
    let prev_value = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| Error::InvalidConfig("CHECK needs prevResult".into()))?;
    let prev = CniResult::from_value(prev_value, "prevResult")?;
    if let Some(plugin) = conf.ipam_type()? {
        ipam::exec(env, &plugin, Command::Check, stdin)?;
    }
    let (iface_index, iface) = prev
        .interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| i.name == env.ifname && i.sandbox.as_deref().is_none_or(|s| s == env.netns))
        .ok_or_else(|| {
            Error::InvalidConfig(format!(
                "prevResult has no interface {} in {}",
                env.ifname, env.netns
            ))
        })?;

    let pod_ns = env.open_netns(kernel)?;
    let pod = kernel.links(Some(&pod_ns))?;
    let where_ = format!("{} in {}", env.ifname, env.netns);
    let link = pod
        .get_link(&env.ifname)?
        .ok_or_else(|| Error::CheckFailed(format!("link {where_} does not exist")))?;
    if !link.is_macvtap() {
        return Err(Error::CheckFailed(format!(
            "link {where_} is a {}, not a macvtap",
            link.kind.as_deref().unwrap_or("physical NIC")
        )));
    }
    let want_mac = match &iface.mac {
        Some(m) if !m.is_empty() => Some(m.to_ascii_lowercase()),
        _ => conf
            .resolve_mac(&env.args)?
            .map(|m| macvtap_link::link::format_mac(&m)),
    };
    if let Some(want) = want_mac {
        if link.mac_string() != want {
            return Err(Error::CheckFailed(format!(
                "link {where_} has MAC {} but {want} was set",
                link.mac_string()
            )));
        }
    }
    let want_mtu = iface.mtu.or((conf.mtu > 0).then_some(conf.mtu));
    if let Some(want) = want_mtu {
        if link.mtu != want {
            return Err(Error::CheckFailed(format!(
                "link {where_} has MTU {} but {want} was set",
                link.mtu
            )));
        }
    }
    if !link.is_up() {
        return Err(Error::CheckFailed(format!("link {where_} is down")));
    }
    if conf.promisc_mode && !link.is_promisc() {
        return Err(Error::CheckFailed(format!(
            "link {where_} is not promiscuous"
        )));
    }
    let have = pod.list_addrs(link.index)?;
    for ip in prev
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(iface_index))
    {
        let want = parse_cidr(&ip.address)
            .ok_or_else(|| Error::InvalidConfig(format!("prevResult address {:?}", ip.address)))?;
        if !have.contains(&want) {
            return Err(Error::CheckFailed(format!(
                "link {where_} lacks address {}",
                ip.address
            )));
        }
    }
    Ok(())
}
