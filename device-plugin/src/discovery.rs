//! Auto-discovery: which links of the node are NICs that get a resource.

use crate::config::{ResourceConfig, check_resource_name};
use macvtap_link::Link;

/// `IFF_LOOPBACK`.
const IFF_LOOPBACK: u32 = 0x8;

/// Whether `link` is a NIC to advertise: not loopback, and either without
/// `IFLA_INFO_KIND` (a physical NIC), a bond, or of one of `extra_kinds`
/// (e.g. `veth` on test nodes).
pub fn is_nic(link: &Link, extra_kinds: &[String]) -> bool {
    if link.flags & IFF_LOOPBACK != 0 {
        return false;
    }
    match link.kind.as_deref() {
        None => true,
        Some("bond") => true,
        Some(k) => extra_kinds.iter().any(|e| e == k),
    }
}

/// The resources auto-discovery makes for `links`: one per NIC, named after
/// it, bridge mode, capacity 100. NICs whose name is not a valid resource
/// name are left out.
pub fn discover(links: &[Link], extra_kinds: &[String]) -> Vec<ResourceConfig> {
    links
        .iter()
        .filter(|l| is_nic(l, extra_kinds))
        .filter(|l| check_resource_name(&l.name).is_ok())
        .map(|l| ResourceConfig::for_nic(&l.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, kind: Option<&str>, flags: u32) -> Link {
        Link {
            name: name.into(),
            kind: kind.map(String::from),
            flags,
            ..Default::default()
        }
    }

    #[test]
    fn physical_nics_and_bonds_are_found_others_not() {
        let links = [
            link("lo", None, IFF_LOOPBACK),
            link("eth0", None, 0),
            link("bond0", Some("bond"), 0),
            link("veth1", Some("veth"), 0),
            link("mvt000000000000", Some("macvtap"), 0),
            link("br0", Some("bridge"), 0),
        ];
        let names: Vec<_> = discover(&links, &[]).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["eth0", "bond0"]);
        let names: Vec<_> = discover(&links, &["veth".into()])
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["eth0", "bond0", "veth1"]);
        assert_eq!(discover(&links, &[])[0], ResourceConfig::for_nic("eth0"));
    }
}
