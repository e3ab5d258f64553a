//! Where a configured resource goes on this node (issue 46, item 4): not
//! at all when its node selector does not match the Node's labels (or they
//! are unknown), else on its `lowerDevice`, or on the first NIC its NIC
//! selector matches ([`crate::placement`]). A NIC's driver and PCI vendor
//! and device IDs are read from sysfs under the root the daemon is given
//! (`/sys`), so tests point it at a tree of their own:
//! `<sysfs>/class/net/<nic>/device/driver` (a link whose last component is
//! the driver's name), `.../device/vendor` and `.../device/device` (`0x`
//! and 4 hex digits).
//!
//! A NIC's device does not change while its link exists, so what sysfs
//! says of it is read once per link (its ifindex and name) and kept in
//! [`Placements`]: a node's churn of links (a veth per pod) reads nothing.
//!
//! Each node serves an entry on the first NIC that matches: the selector's
//! `names` in their order when it has them, else the links in ifindex
//! order (those whose name matches its `pattern`, or without one the NICs
//! auto-discovery counts: physical NICs, bonds, `--discover-kinds`). Two
//! entries that land on one NIC where one is passthru cannot both work:
//! the passthru one is not served here ([`place_all`]).

use crate::config::ResourceConfig;
use crate::core::nic::discovery::is_nic;
use crate::placement::{NicSelector, pattern_matches, pci_id};
use macvtap_link::{Link, MacvtapMode};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use tracing::{info, warn};

/// `IFF_LOOPBACK`.
const IFF_LOOPBACK: u32 = 0x8;

/// What sysfs says of a NIC's device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NicIdentity {
    /// Whether the NIC has a device behind it (`device` in sysfs); a
    /// virtual link (veth, bridge, bond) has none.
    pub has_device: bool,
    /// The driver's name.
    pub driver: Option<String>,
    /// The PCI vendor ID, 4 lower-case hex digits.
    pub vendor: Option<String>,
    /// The PCI device ID, 4 lower-case hex digits.
    pub device: Option<String>,
}

/// Reads NIC `ifname`'s device from `<sysfs>/class/net/<ifname>/device`:
/// the driver link's last component, `vendor` and `device`. What cannot be
/// read is `None`.
pub(crate) fn identity(sysfs: &Path, ifname: &str) -> NicIdentity {
    let dev = sysfs.join("class/net").join(ifname).join("device");
    let id = |file: &str| {
        std::fs::read_to_string(dev.join(file))
            .ok()
            .and_then(|t| pci_id(&t))
    };
    NicIdentity {
        has_device: dev.exists(),
        driver: std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
        vendor: id("vendor"),
        device: id("device"),
    }
}

/// What is known of the Node's labels.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Labels<'a> {
    /// As last read.
    Known(&'a BTreeMap<String, String>),
    /// Not known, and why (a phrase).
    Unknown(&'a str),
}

/// Where a configured entry goes on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Served, as this resource (`lower_device` the NIC picked), and a
    /// sentence saying which NIC and why (what the selector passed over).
    Here(ResourceConfig, String),
    /// Not served on this node, and why: its node selector, or another
    /// entry on the NIC.
    NotHere(String),
    /// Its node selector matches (or it has none) but no NIC matches its
    /// NIC selector, and why not each one looked at.
    NoNic(String),
}

/// Which NIC `sel` picks among `links` (`extra_kinds` as auto-discovery
/// counts them), reading drivers and PCI IDs under `sysfs` (through the
/// cache of `placements`): the NIC, and each NIC passed over with why;
/// `None` when none matches.
pub(crate) fn choose(
    sel: &NicSelector,
    links: &[Link],
    extra_kinds: &[String],
    sysfs: &Path,
    placements: &Placements,
) -> (Option<String>, Vec<(String, String)>) {
    let usable = |l: &Link| l.flags & IFF_LOOPBACK == 0 && l.kind.as_deref() != Some("macvtap");
    let candidates: Vec<Result<&Link, String>> = if sel.names.is_empty() {
        links
            .iter()
            .filter(|l| usable(l))
            .filter(|l| match &sel.pattern {
                Some(p) => pattern_matches(p, &l.name),
                None => is_nic(l, extra_kinds),
            })
            .map(Ok)
            .collect()
    } else {
        sel.names
            .iter()
            .map(|n| {
                links
                    .iter()
                    .find(|l| l.name == *n)
                    .filter(|l| usable(l))
                    .ok_or_else(|| n.clone())
            })
            .collect()
    };
    let mut passed = Vec::new();
    for c in candidates {
        let link = match c {
            Ok(l) => l,
            Err(name) => {
                let why = if links.iter().any(|l| l.name == name) {
                    "it is a loopback or macvtap link"
                } else {
                    "there is no such link"
                };
                passed.push((name, why.to_string()));
                continue;
            }
        };
        let why = mismatch(sel, link, sysfs, placements);
        if why.is_empty() {
            return (Some(link.name.clone()), passed);
        }
        passed.push((link.name.clone(), why.join("; ")));
    }
    (None, passed)
}

/// Why `link` does not match `sel` (empty: it does), reading its device
/// under `sysfs` only when `sel` asks for something there.
fn mismatch(sel: &NicSelector, link: &Link, sysfs: &Path, placements: &Placements) -> Vec<String> {
    let mut why = Vec::new();
    if let Some(p) = &sel.pattern
        && !pattern_matches(p, &link.name)
    {
        why.push(format!("its name does not match {p}"));
    }
    if !sel.reads_sysfs() {
        return why;
    }
    let id = placements.identity(sysfs, link);
    if !id.has_device {
        why.push("it has no device in sysfs (a virtual link), so no driver or PCI IDs".into());
        return why;
    }
    let mut compare = |what: &str, want: &Option<String>, have: &Option<String>| {
        if let Some(want) = want
            && have.as_ref() != Some(want)
        {
            why.push(match have {
                Some(h) => format!("its {what} is {h}, not {want}"),
                None => format!("its {what} cannot be read, so it is not {want}"),
            });
        }
    };
    compare("driver", &sel.driver, &id.driver);
    compare("PCI vendor", &sel.vendor, &id.vendor);
    compare("PCI device", &sel.device, &id.device);
    why
}

/// `passed` as `eth0 (its driver is e1000e, not ixgbe), eth1 (...)`.
fn passed_text(passed: &[(String, String)]) -> String {
    passed
        .iter()
        .map(|(n, w)| format!("{n} ({w})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where `cfg` goes on a node with `links` and `labels` (see [`choose`]
/// for `extra_kinds`, `sysfs` and `placements`).
pub(crate) fn place(
    cfg: &ResourceConfig,
    links: &[Link],
    extra_kinds: &[String],
    labels: Labels<'_>,
    sysfs: &Path,
    placements: &Placements,
) -> Placed {
    let Some(placement) = &cfg.placement else {
        return Placed::Here(
            cfg.clone(),
            format!("on its lowerDevice {}", cfg.lower_device),
        );
    };
    let mut said = Vec::new();
    if !placement.nodes.is_empty() {
        match labels {
            Labels::Unknown(why) => {
                return Placed::NotHere(format!(
                    "its nodeSelector {} cannot be checked: the Node's labels are unknown ({why})",
                    placement.nodes_text()
                ));
            }
            Labels::Known(l) if !placement.node_matches(l) => {
                return Placed::NotHere(format!(
                    "this node is not one its nodeSelector {} selects: {}",
                    placement.nodes_text(),
                    placement.node_mismatch(l).join(", ")
                ));
            }
            Labels::Known(_) => said.push(format!(
                "this node has the labels {} its nodeSelector asks",
                placement.nodes_text()
            )),
        }
    }
    let Some(sel) = &placement.nic else {
        said.push(format!("on its lowerDevice {}", cfg.lower_device));
        return Placed::Here(cfg.clone(), said.join("; "));
    };
    match choose(sel, links, extra_kinds, sysfs, placements) {
        (Some(nic), passed) => {
            let mut c = cfg.clone();
            c.lower_device = nic.clone();
            said.push(format!("on NIC {nic}, {sel}"));
            if !passed.is_empty() {
                said.push(format!("passed over {}", passed_text(&passed)));
            }
            Placed::Here(c, said.join("; "))
        }
        (None, passed) if passed.is_empty() => {
            Placed::NoNic(format!("no link on this node is a candidate for {sel}"))
        }
        (None, passed) => Placed::NoNic(format!(
            "no NIC on this node is {sel}: {}",
            passed_text(&passed)
        )),
    }
}

/// Where each of `list` goes on this node ([`place`]), in order; then of
/// two served entries that landed on one NIC where one is passthru (and
/// one has a placement: the configuration refused such a pair of plain
/// entries already), the passthru one (the later when both are) is not
/// served here.
pub(crate) fn place_all(
    list: &[ResourceConfig],
    links: &[Link],
    extra_kinds: &[String],
    labels: Labels<'_>,
    sysfs: &Path,
    placements: &Placements,
) -> Vec<Placed> {
    placements.forget_gone(links);
    let mut out: Vec<Placed> = list
        .iter()
        .map(|c| place(c, links, extra_kinds, labels, sysfs, placements))
        .collect();
    let passthru = |c: &ResourceConfig| c.mode == MacvtapMode::Passthru;
    let mut kept: Vec<usize> = Vec::new();
    for n in 0..out.len() {
        let Placed::Here(r, _) = &out[n] else {
            continue;
        };
        let clash = kept.iter().copied().find(|&k| {
            let Placed::Here(o, _) = &out[k] else {
                return false;
            };
            o.lower_device == r.lower_device
                && (passthru(o) || passthru(r))
                && (o.placement.is_some() || r.placement.is_some())
        });
        let Some(k) = clash else {
            kept.push(n);
            continue;
        };
        let (Placed::Here(o, _), Placed::Here(r, _)) = (&out[k], &out[n]) else {
            continue;
        };
        let (out_at, other) = if passthru(r) { (n, o) } else { (k, r) };
        let why = format!(
            "{} takes NIC {} on this node too, and a passthru macvtap must be alone on its NIC",
            other.resource_name(),
            r.lower_device
        );
        if out_at == k {
            kept.retain(|&x| x != k);
            kept.push(n);
        }
        out[out_at] = Placed::NotHere(why);
    }
    out
}

/// Placement with memory: it logs where each entry goes once, and again
/// only when that changes; and keeps what sysfs said of each link's device.
#[derive(Debug, Default)]
pub(crate) struct Placements {
    said: Mutex<BTreeMap<String, String>>,
    identities: Mutex<BTreeMap<(u32, String), NicIdentity>>,
}

impl Placements {
    /// What sysfs under `sysfs` says of `link`'s device, read once per
    /// link (its ifindex and name).
    pub(crate) fn identity(&self, sysfs: &Path, link: &Link) -> NicIdentity {
        let mut known = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        known
            .entry((link.index, link.name.clone()))
            .or_insert_with(|| identity(sysfs, &link.name))
            .clone()
    }

    /// Forgets what was read of links that are gone (or renamed).
    fn forget_gone(&self, links: &[Link]) {
        let mut known = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|(index, name), _| links.iter().any(|l| l.index == *index && l.name == *name));
    }

    /// Logs what `placed` says of each entry of `list` (by name) that it
    /// had not said yet, and forgets entries no longer configured. Only
    /// entries with a placement are said (the others go where they say).
    pub(crate) fn log(&self, list: &[ResourceConfig], placed: &[Placed]) {
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        said.retain(|name, _| list.iter().any(|c| c.name == *name));
        for (cfg, p) in list.iter().zip(placed) {
            if cfg.placement.is_none() {
                continue;
            }
            let resource = cfg.resource_name();
            let sentence = match p {
                Placed::Here(_, why) => format!("served {why}"),
                Placed::NotHere(why) => format!("not served here: {why}"),
                Placed::NoNic(why) => format!("not served here: {why}"),
            };
            if said.get(&cfg.name) == Some(&sentence) {
                continue;
            }
            match p {
                Placed::NoNic(_) => warn!(%resource, "{resource}: {sentence}"),
                _ => info!(%resource, "{resource}: {sentence}"),
            }
            said.insert(cfg.name.clone(), sentence);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Placement;
    use test_support::fake::{link, nic};

    /// A fake sysfs with NIC `name`'s device: its driver (a link to
    /// `../../bus/pci/drivers/<driver>`), vendor and device files.
    fn fake_nic(root: &Path, name: &str, driver: &str, vendor: &str, device: &str) {
        let dev = root.join("class/net").join(name).join("device");
        std::fs::create_dir_all(&dev).unwrap();
        let drivers = root.join("bus/pci/drivers").join(driver);
        std::fs::create_dir_all(&drivers).unwrap();
        std::os::unix::fs::symlink(&drivers, dev.join("driver")).unwrap();
        std::fs::write(dev.join("vendor"), format!("0x{vendor}\n")).unwrap();
        std::fs::write(dev.join("device"), format!("0x{device}\n")).unwrap();
    }

    /// A node's links: eth0 (e1000e, Intel 10d3), ens5f0 and ens5f1
    /// (ixgbe, Intel 10fb), enp3s0 (mlx5_core, Mellanox 1017), a veth, a
    /// bond and lo; and their fake sysfs.
    fn node() -> (Vec<Link>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        fake_nic(dir.path(), "eth0", "e1000e", "8086", "10d3");
        fake_nic(dir.path(), "ens5f0", "ixgbe", "8086", "10fb");
        fake_nic(dir.path(), "ens5f1", "ixgbe", "8086", "10FB");
        fake_nic(dir.path(), "enp3s0", "mlx5_core", "15b3", "1017");
        let mut lo = nic(1, "lo", true);
        lo.flags |= IFF_LOOPBACK;
        let links = vec![
            lo,
            nic(2, "eth0", true),
            nic(3, "ens5f0", true),
            nic(4, "ens5f1", true),
            nic(5, "enp3s0", true),
            link(6, "veth0", "veth", None),
            link(7, "bond0", "bond", None),
            link(8, "mvt000000000001", "macvtap", Some(3)),
        ];
        (links, dir)
    }

    fn sel(f: impl FnOnce(&mut NicSelector)) -> NicSelector {
        let mut s = NicSelector::default();
        f(&mut s);
        s
    }

    fn chosen(s: &NicSelector, links: &[Link], sysfs: &Path) -> Option<String> {
        choose(s, links, &[], sysfs, &Placements::default()).0
    }

    #[test]
    fn identity_is_read_from_the_sysfs_root_given() {
        let (_, dir) = node();
        let id = identity(dir.path(), "ens5f1");
        assert_eq!(
            id,
            NicIdentity {
                has_device: true,
                driver: Some("ixgbe".into()),
                vendor: Some("8086".into()),
                device: Some("10fb".into()),
            }
        );
        assert_eq!(identity(dir.path(), "veth0"), NicIdentity::default());
    }

    #[test]
    fn each_criterion_picks_the_first_nic_that_matches() {
        let (links, dir) = node();
        let root = dir.path();
        // A driver: in ifindex order, among the NICs discovery counts.
        assert_eq!(
            chosen(&sel(|s| s.driver = Some("ixgbe".into())), &links, root).as_deref(),
            Some("ens5f0")
        );
        // Vendor and device, read as sysfs writes them (upper case too).
        assert_eq!(
            chosen(
                &sel(|s| {
                    s.vendor = Some("15b3".into());
                    s.device = Some("1017".into())
                }),
                &links,
                root
            )
            .as_deref(),
            Some("enp3s0")
        );
        // A pattern, and a pattern with a driver.
        assert_eq!(
            chosen(&sel(|s| s.pattern = Some("ens5f?".into())), &links, root).as_deref(),
            Some("ens5f0")
        );
        assert_eq!(
            chosen(
                &sel(|s| {
                    s.pattern = Some("e*".into());
                    s.driver = Some("mlx5_core".into())
                }),
                &links,
                root
            )
            .as_deref(),
            Some("enp3s0")
        );
        // Names, in their order, the first that exists and matches the rest.
        let names = |n: &[&str]| sel(|s| s.names = n.iter().map(|x| x.to_string()).collect());
        assert_eq!(
            chosen(&names(&["eth9", "ens5f1", "ens5f0"]), &links, root).as_deref(),
            Some("ens5f1")
        );
        let mut by_name_and_driver = names(&["eth0", "enp3s0", "ens5f0"]);
        by_name_and_driver.driver = Some("ixgbe".into());
        let (nic, passed) = choose(
            &by_name_and_driver,
            &links,
            &[],
            root,
            &Placements::default(),
        );
        assert_eq!(nic.as_deref(), Some("ens5f0"));
        assert_eq!(
            passed,
            [
                (
                    "eth0".to_string(),
                    "its driver is e1000e, not ixgbe".to_string()
                ),
                (
                    "enp3s0".to_string(),
                    "its driver is mlx5_core, not ixgbe".to_string()
                ),
            ]
        );
        // A virtual link has no driver; a name may be any link, a veth too.
        let (nic, passed) = choose(
            &sel(|s| {
                s.names = vec!["veth0".into()];
                s.driver = Some("ixgbe".into())
            }),
            &links,
            &[],
            root,
            &Placements::default(),
        );
        assert_eq!(nic, None);
        assert!(
            passed[0].1.starts_with("it has no device in sysfs"),
            "{passed:?}"
        );
        assert_eq!(
            chosen(&names(&["veth0"]), &links, root).as_deref(),
            Some("veth0")
        );
        // Never loopback or a macvtap.
        assert_eq!(
            chosen(&names(&["lo", "mvt000000000001"]), &links, root),
            None
        );
        assert_eq!(
            chosen(&sel(|s| s.pattern = Some("*".into())), &links, root).as_deref(),
            Some("eth0")
        );
    }

    #[test]
    fn without_names_or_pattern_only_the_nics_discovery_counts_are_looked_at() {
        let (links, dir) = node();
        // A veth has no driver anyway; with --discover-kinds it is looked
        // at (and passed over, said why).
        let s = sel(|s| s.driver = Some("veth-none".into()));
        let (_, passed) = choose(&s, &links, &[], dir.path(), &Placements::default());
        let names: Vec<&str> = passed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["eth0", "ens5f0", "ens5f1", "enp3s0", "bond0"]);
        let (_, passed) = choose(
            &s,
            &links,
            &["veth".into()],
            dir.path(),
            &Placements::default(),
        );
        assert!(passed.iter().any(|(n, _)| n == "veth0"));
    }

    fn entry(name: &str, nic: Option<NicSelector>, nodes: &[(&str, &str)]) -> ResourceConfig {
        ResourceConfig {
            lower_device: if nic.is_some() {
                String::new()
            } else {
                name.to_string()
            },
            placement: Some(Placement {
                nic,
                nodes: nodes
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            ..ResourceConfig::for_nic(name)
        }
    }

    #[test]
    fn the_node_selector_decides_before_the_nic() {
        let (links, dir) = node();
        let cfg = entry(
            "dp",
            Some(sel(|s| s.driver = Some("ixgbe".into()))),
            &[("role", "dp")],
        );
        let dp = BTreeMap::from([("role".to_string(), "dp".to_string())]);
        let web = BTreeMap::from([("role".to_string(), "web".to_string())]);
        let p = Placements::default();
        match place(&cfg, &links, &[], Labels::Known(&dp), dir.path(), &p) {
            Placed::Here(c, why) => {
                assert_eq!(c.lower_device, "ens5f0");
                assert_eq!(
                    why,
                    "this node has the labels role=dp its nodeSelector asks; on NIC ens5f0, the \
                     first NIC with driver ixgbe; passed over eth0 (its driver is e1000e, not \
                     ixgbe)"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            place(&cfg, &links, &[], Labels::Known(&web), dir.path(), &p),
            Placed::NotHere(
                "this node is not one its nodeSelector role=dp selects: its label role is \
                 \"web\", not \"dp\""
                    .into()
            )
        );
        assert!(matches!(
            place(&cfg, &links, &[], Labels::Unknown("NODE_NAME is not set"), dir.path(), &p),
            Placed::NotHere(why) if why.ends_with("the Node's labels are unknown (NODE_NAME is not set)")
        ));
        // A plain entry goes where it says, labels or not.
        let plain = ResourceConfig::for_nic("eth1");
        assert!(matches!(
            place(&plain, &links, &[], Labels::Unknown("x"), dir.path(), &p),
            Placed::Here(c, _) if c == plain
        ));
        // No NIC matches: said, with each one looked at.
        let none = entry("dp", Some(sel(|s| s.driver = Some("ice".into()))), &[]);
        assert!(matches!(
            place(&none, &links, &[], Labels::Known(&dp), dir.path(), &p),
            Placed::NoNic(why) if why.starts_with("no NIC on this node is the first NIC with driver ice: eth0 (its driver is e1000e, not ice)")
        ));
    }

    #[test]
    fn a_passthru_entry_sharing_the_nic_it_picked_is_not_served() {
        let (links, dir) = node();
        let bridge = entry("a", Some(sel(|s| s.driver = Some("ixgbe".into()))), &[]);
        let passthru = ResourceConfig {
            mode: MacvtapMode::Passthru,
            capacity: 1,
            ..entry("b", Some(sel(|s| s.pattern = Some("ens5f*".into()))), &[])
        };
        let other = entry("c", Some(sel(|s| s.names = vec!["ens5f1".into()])), &[]);
        let placed = place_all(
            &[bridge, passthru, other],
            &links,
            &[],
            Labels::Unknown("x"),
            dir.path(),
            &Placements::default(),
        );
        assert!(matches!(&placed[0], Placed::Here(c, _) if c.lower_device == "ens5f0"));
        assert_eq!(
            placed[1],
            Placed::NotHere(
                "macvtap.network.kubevirt.io/a takes NIC ens5f0 on this node too, and a \
                 passthru macvtap must be alone on its NIC"
                    .into()
            )
        );
        assert!(matches!(&placed[2], Placed::Here(c, _) if c.lower_device == "ens5f1"));
    }

    #[test]
    fn a_devices_identity_is_read_once_per_link() {
        let (links, dir) = node();
        let p = Placements::default();
        let ens = links.iter().find(|l| l.name == "ens5f0").unwrap();
        assert_eq!(p.identity(dir.path(), ens).driver.as_deref(), Some("ixgbe"));
        // sysfs changes under a link that stays: the read stands.
        std::fs::remove_dir_all(dir.path().join("class/net/ens5f0")).unwrap();
        assert_eq!(p.identity(dir.path(), ens).driver.as_deref(), Some("ixgbe"));
        // The link gone (a new one may take its name): read again.
        p.forget_gone(&links[..2]);
        assert!(!p.identity(dir.path(), ens).has_device);
    }
}
