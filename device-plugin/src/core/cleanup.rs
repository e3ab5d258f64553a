//! What an uninstall removes from the node, and what it keeps. It removes
//! only what nobody holds, by the reclaimer's own rules
//! ([`crate::core::reclaim`]): our macvtaps in the host's namespace on a
//! NIC of this daemon's configuration whose device no pod holds (per the
//! kubelet's PodResources) and that the allocation clock did not hand out
//! within the reclaim grace; the CNI binary and its node settings only
//! when no pod holds one of our devices (their pods' DEL, and a sandbox
//! re-created, still run the CNI), and only when they are provably ours
//! (the binary's bytes are the image's, the settings are our format),
//! through the directory's descriptor, never following a link, and only
//! when no install-cni ran since the daemon started (another install of
//! ours, such as our DaemonSet applied in another namespace, uses them:
//! [`crate::install::CniStamps`]); and the record, last. A link a pod holds is in the host's namespace between
//! Allocate and the CNI's ADD, and after a DEL gave it back while the
//! pod's sandbox is re-created: kept, so that pod's next ADD still finds
//! it. Everything kept is named with its reason. The daemon runs this as
//! it exits when its DaemonSet was deleted ([`crate::operator::owner`]),
//! after the work under way finished ([`crate::core::inflight`]).

use super::ledger::AllocationClock;
use super::ledger::clock::ClockHold;
use super::ledger::record_file;
use super::reclaim::{go_era_leaked_links, leaked_links};
use crate::config::ResourceConfig;
use crate::install::{CniStamps, DIR_LOCK_WAIT, lock_dir};
use macvtap_link::{CNI_SETTINGS_FILE, Link, Links, NodeSettingsFile, parse_link_name};
use macvtap_link::{DeviceLinkName, link_name_for_device};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What pods hold of our devices, as the kubelet's PodResources said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// These device IDs of ours are held by pods.
    Devices(HashSet<String>),
    /// The kubelet could not be asked (why).
    Unknown(String),
}

/// The node as the clean-up sees it: the resources this daemon serves,
/// what pods hold, and when each link was last handed out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InUse<'a> {
    /// The resources of this daemon's configuration at exit.
    pub resources: &'a [ResourceConfig],
    /// What pods hold.
    pub held: &'a Held,
    /// When each link was last handed out.
    pub clock: &'a AllocationClock,
    /// The reclaim grace: a link handed out more recently is kept.
    pub grace: Duration,
    /// Now, for the grace.
    pub now: Instant,
}

/// Where the CNI's files are, and what proves them ours.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CniFiles<'a> {
    /// The host's CNI bin dir as mounted.
    pub dir: &'a Path,
    /// The binary's name there (`macvtap`).
    pub name: &'a str,
    /// The binary this image ships (`/macvtap`): the installed one is
    /// removed only when its bytes are these.
    pub shipped: &'a Path,
    /// The files' stamps as the daemon found them at start: if an
    /// install-cni has marked them since, they are another install's.
    pub found: CniStamps,
}

/// What [`clean_node`] did and left.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Cleaned {
    /// Our macvtaps deleted from the host's namespace.
    pub links: Vec<String>,
    /// Links that could not be deleted, with the error.
    pub links_failed: Vec<(String, String)>,
    /// Files and directories removed.
    pub removed: Vec<PathBuf>,
    /// What was kept, and why, one phrase each.
    pub kept: Vec<String>,
}

/// Removes from the node what an install of ours left there and nobody
/// holds (the module doc says what): our macvtaps on `links` (the host's
/// namespace) by `in_use`, the CNI binary and settings in `cni` (when
/// given), then the record directory under `plugin_dir`.
pub(crate) fn clean_node(
    links: &dyn Links,
    in_use: InUse<'_>,
    cni: Option<CniFiles<'_>>,
    plugin_dir: &Path,
) -> Cleaned {
    let mut out = Cleaned::default();
    clean_links(links, in_use, &mut out);
    match cni {
        Some(cni) => clean_cni(cni, in_use.held, &mut out),
        None => out.kept.push(
            "the CNI binary and its settings: no --uninstall-cni-dir names where they are".into(),
        ),
    }
    let record = record_file::path_in(plugin_dir);
    // remove_dir_all removes a symbolic link itself, never what it points to.
    if let Some(dir) = record.parent().filter(|d| d.symlink_metadata().is_ok()) {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => out.removed.push(dir.to_path_buf()),
            Err(e) => out.kept.push(format!(
                "the record {} (it could not be removed: {e})",
                dir.display()
            )),
        }
    }
    out
}

/// Why one link of ours is kept, or `None` when nobody holds it.
fn kept_because(
    l: &Link,
    unheld: &HashSet<u32>,
    in_use: InUse<'_>,
    hold: &ClockHold<'_>,
) -> Option<String> {
    let Held::Devices(held) = in_use.held else {
        return Some("the kubelet could not say which devices pods hold".into());
    };
    let device = match parse_link_name(&l.name) {
        Some(DeviceLinkName::GoEra { .. }) => Some(l.name.clone()),
        _ => held
            .iter()
            .find(|id| link_name_for_device(id) == l.name)
            .cloned(),
    };
    if let Some(id) = device.as_ref().filter(|id| held.contains(*id)) {
        return Some(format!("device {id}, held by a pod"));
    }
    if !unheld.contains(&l.index) {
        return Some("not on a NIC of this daemon's configuration".into());
    }
    let recent = [Some(l.name.as_str()), device.as_deref()]
        .into_iter()
        .flatten()
        .any(|n| hold.allocated_within(n, in_use.grace, in_use.now));
    recent.then(|| {
        format!(
            "handed out within the reclaim grace ({} s): its pod may be starting",
            in_use.grace.as_secs()
        )
    })
}

/// Deletes our macvtaps that nobody holds (deciding and deleting with the
/// allocation clock held, so no Allocate interleaves), naming each one kept.
fn clean_links(links: &dyn Links, in_use: InUse<'_>, out: &mut Cleaned) {
    let list = match links.list_links() {
        Ok(list) => list,
        Err(e) => {
            out.kept.push(format!(
                "every link of ours: the host's links could not be listed ({e})"
            ));
            return;
        }
    };
    let allocated = match in_use.held {
        Held::Devices(ids) => ids.clone(),
        Held::Unknown(_) => HashSet::new(),
    };
    let lowers: HashSet<String> = in_use
        .resources
        .iter()
        .map(|r| r.lower_device.clone())
        .collect();
    let unheld: HashSet<u32> = leaked_links(&list, &lowers, &allocated)
        .into_iter()
        .chain(go_era_leaked_links(&list, in_use.resources, &allocated))
        .map(|l| l.index)
        .collect();
    let names: HashMap<u32, &str> = list.iter().map(|l| (l.index, l.name.as_str())).collect();
    let hold = in_use.clock.hold();
    for l in list
        .iter()
        .filter(|l| l.is_macvtap() && parse_link_name(&l.name).is_some())
    {
        if let Some(why) = kept_because(l, &unheld, in_use, &hold) {
            let nic = l
                .lower_index
                .and_then(|i| names.get(&i).copied())
                .unwrap_or("?");
            out.kept
                .push(format!("macvtap {} on {nic} ({why})", l.name));
            continue;
        }
        match links.del_link(l.index, &l.name) {
            Ok(()) => out.links.push(l.name.clone()),
            Err(e) => out.links_failed.push((l.name.clone(), e.to_string())),
        }
    }
}

/// Removes the CNI binary and its settings when no pod holds a device and
/// each is provably ours; otherwise names them kept.
fn clean_cni(cni: CniFiles<'_>, held: &Held, out: &mut Cleaned) {
    let both = format!(
        "{} and {CNI_SETTINGS_FILE}",
        cni.dir.join(cni.name).display()
    );
    match held {
        Held::Devices(ids) if !ids.is_empty() => {
            out.kept.push(format!(
                "{both} (pods hold {} of our devices, and their DEL runs the CNI)",
                ids.len()
            ));
            return;
        }
        Held::Unknown(why) => {
            out.kept.push(format!(
                "{both} (the kubelet could not say whether pods hold our devices: {why})"
            ));
            return;
        }
        Held::Devices(_) => {}
    }
    let dir = match open_dir(cni.dir) {
        Ok(d) => d,
        Err(e) => {
            out.kept
                .push(format!("{both} (the directory could not be opened: {e})"));
            return;
        }
    };
    // Held until the files are removed, so no install-cni runs between the
    // stamps' check and the removal.
    let dir = match lock_dir(dir, DIR_LOCK_WAIT) {
        Ok(lock) => lock,
        Err(e) => {
            out.kept
                .push(format!("{both} (the directory could not be locked: {e})"));
            return;
        }
    };
    if cni
        .found
        .installed_since(&CniStamps::read(cni.dir, cni.name))
    {
        out.kept.push(format!(
            "{both} (installed again on this node since this daemon started, by another \
             install of ours that uses them, such as our DaemonSet in another namespace)"
        ));
        return;
    }
    let shipped = std::fs::read(cni.shipped);
    let checks: [(&str, &Proof); 2] = [
        (cni.name, &|bytes| match &shipped {
            Ok(ours) if ours.as_slice() == bytes => Ok(()),
            Ok(_) => Err(format!(
                "it is not the binary this image ships at {}",
                cni.shipped.display()
            )),
            Err(e) => Err(format!(
                "the binary this image ships at {} cannot be read to compare: {e}",
                cni.shipped.display()
            )),
        }),
        (CNI_SETTINGS_FILE, &|bytes| {
            NodeSettingsFile::from_json(bytes)
                .map(|_| ())
                .map_err(|e| format!("it is not our settings file: {e}"))
        }),
    ];
    for (name, ours) in checks {
        let path = cni.dir.join(name);
        match remove_if(&dir, name, ours) {
            Ok(true) => out.removed.push(path),
            Ok(false) => {}
            Err(why) => out.kept.push(format!("{} ({why})", path.display())),
        }
    }
}

/// Whether a file's bytes are ours: `Err(why not)`.
type Proof<'a> = dyn Fn(&[u8]) -> Result<(), String> + 'a;

/// Opens `dir` as a directory, not following a link at its last component.
fn open_dir(dir: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
}

/// Removes `name` in `dir` when it is a regular file whose bytes `ours`
/// accepts: `Ok(false)` when there is none, `Err(why)` when it is kept.
/// Opened through `dir` without following a link and without blocking on a
/// FIFO; removed by name (an unlink never follows a link).
fn remove_if(dir: &OwnedFd, name: &str, ours: &Proof<'_>) -> Result<bool, String> {
    /// The largest file compared (the CNI binary is a few MiB).
    const MAX: u64 = 256 << 20;
    let fd = match nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        Err(nix::errno::Errno::ELOOP) => {
            return Err("it is a symbolic link, which is not ours: not followed".into());
        }
        Err(e) => return Err(format!("it cannot be opened: {e}")),
    };
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err("it is not a regular file, so not ours".into());
    }
    if meta.len() > MAX {
        return Err(format!("it is {} bytes, more than ours", meta.len()));
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("it cannot be read: {e}"))?;
    ours(&bytes)?;
    match nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(true),
        Err(nix::errno::Errno::ENOENT) => Ok(false),
        Err(e) => Err(format!("it could not be removed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::{Kernel, MacvtapMode};
    use test_support::fake::{FakeKernel, HOST};

    const SHIPPED: &[u8] = b"\x7fELF the CNI";

    struct Node {
        _tmp: tempfile::TempDir,
        plugin_dir: PathBuf,
        cni: PathBuf,
        shipped: PathBuf,
        /// The CNI files' stamps once "installed", as the daemon reads
        /// them at start.
        found: CniStamps,
        kernel: FakeKernel,
        resources: Vec<ResourceConfig>,
    }

    impl Node {
        /// The record, the CNI as install-cni leaves it, another plugin,
        /// and on the fake kernel: resource `eth0` on NIC eth0, another NIC
        /// eth9 of no resource.
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let plugin_dir = tmp.path().join("device-plugins");
            let record = record_file::path_in(&plugin_dir);
            std::fs::create_dir_all(record.parent().unwrap()).unwrap();
            std::fs::write(&record, "{}").unwrap();
            let shipped = tmp.path().join("image-macvtap");
            std::fs::write(&shipped, SHIPPED).unwrap();
            let cni = tmp.path().join("cni-bin");
            std::fs::create_dir(&cni).unwrap();
            std::fs::write(cni.join("macvtap"), SHIPPED).unwrap();
            let settings = NodeSettingsFile {
                kubelet_dir: Some("/var/lib/kubelet".into()),
                pod_resources_check: Some(macvtap_link::PodResourcesCheck::Enforce),
                log_dir: None,
            };
            std::fs::write(cni.join(CNI_SETTINGS_FILE), settings.to_json().unwrap()).unwrap();
            std::fs::write(cni.join("bridge"), "x").unwrap();
            let found = CniStamps::read(&cni, "macvtap");
            let kernel = FakeKernel::new();
            kernel.add_nic(HOST, "eth0");
            kernel.add_nic(HOST, "eth9");
            Node {
                _tmp: tmp,
                plugin_dir,
                cni,
                shipped,
                found,
                kernel,
                resources: vec![ResourceConfig::for_nic("eth0")],
            }
        }

        fn macvtap(&self, name: &str, nic: &str) {
            let links = self.kernel.links(None).unwrap();
            let lower = links.get_link(nic).unwrap().unwrap();
            links
                .add_macvtap_at(name, lower.index, MacvtapMode::Bridge, None, None)
                .unwrap();
        }

        fn clean(&self, held: &Held, clock: &AllocationClock, now: Instant) -> Cleaned {
            let links = self.kernel.links(None).unwrap();
            clean_node(
                links.as_ref(),
                InUse {
                    resources: &self.resources,
                    held,
                    clock,
                    grace: Duration::from_secs(60),
                    now,
                },
                Some(CniFiles {
                    dir: &self.cni,
                    name: "macvtap",
                    shipped: &self.shipped,
                    found: self.found,
                }),
                &self.plugin_dir,
            )
        }

        fn link_names(&self) -> Vec<String> {
            let links = self.kernel.links(None).unwrap();
            let mut names: Vec<String> = links
                .list_links()
                .unwrap()
                .into_iter()
                .map(|l| l.name)
                .collect();
            names.sort();
            names
        }
    }

    fn held(ids: &[&str]) -> Held {
        Held::Devices(ids.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn an_uninstall_leaves_nothing_of_ours_when_no_pod_holds_a_device() {
        let n = Node::new();
        let free = link_name_for_device("eth0Mvp0");
        n.macvtap(&free, "eth0");
        n.macvtap("eth0Mvp1", "eth0");
        n.macvtap("macvtap0", "eth0");
        let out = n.clean(&held(&[]), &AllocationClock::default(), Instant::now());
        assert_eq!(out.links, [free.as_str(), "eth0Mvp1"]);
        assert!(out.kept.is_empty(), "{:?}", out.kept);
        assert_eq!(n.link_names(), ["eth0", "eth9", "macvtap0"], "only ours");
        assert!(
            !record_file::path_in(&n.plugin_dir)
                .parent()
                .unwrap()
                .exists()
        );
        assert!(!n.cni.join("macvtap").exists() && !n.cni.join(CNI_SETTINGS_FILE).exists());
        assert!(
            n.cni.join("bridge").exists(),
            "another plugin is left alone"
        );
    }

    /// Our DaemonSet applied in another namespace before this one's
    /// uninstall: its install-cni found the same binary in place and wrote
    /// its settings. Those files are its own now; our links still go.
    #[test]
    fn cni_files_another_install_put_in_place_since_the_start_are_kept() {
        let n = Node::new();
        let free = link_name_for_device("eth0Mvp0");
        n.macvtap(&free, "eth0");
        crate::install::install(
            &n.shipped,
            &n.cni,
            "macvtap",
            Path::new("/var/lib/k0s/kubelet"),
            macvtap_link::PodResourcesCheck::Enforce,
        )
        .unwrap();
        let out = n.clean(&held(&[]), &AllocationClock::default(), Instant::now());
        assert_eq!(out.links, [free.as_str()]);
        assert!(n.cni.join("macvtap").exists() && n.cni.join(CNI_SETTINGS_FILE).exists());
        let kept = out.kept.join("; ");
        assert!(
            kept.contains("macvtap.settings.json (installed again on this node since this daemon started, by another install of ours"),
            "{kept}"
        );
        assert_eq!(out.kept.len(), 1, "{kept}");
    }

    /// Between Allocate and the CNI's ADD, and after a DEL gave the link
    /// back while the pod's sandbox is re-created, a held device's link is
    /// in the host's namespace: kept, with the CNI, so that ADD still works.
    #[test]
    fn a_held_devices_link_in_the_hosts_namespace_is_kept_with_the_cni() {
        let n = Node::new();
        let held_link = link_name_for_device("eth0Mvp3");
        let free = link_name_for_device("eth0Mvp4");
        n.macvtap(&held_link, "eth0");
        n.macvtap("eth0Mvp5", "eth0");
        n.macvtap(&free, "eth0");
        let out = n.clean(
            &held(&["eth0Mvp3", "eth0Mvp5"]),
            &AllocationClock::default(),
            Instant::now(),
        );
        assert_eq!(out.links, [free.as_str()]);
        assert!(n.link_names().contains(&held_link));
        assert!(n.link_names().contains(&"eth0Mvp5".to_string()));
        assert!(n.cni.join("macvtap").exists() && n.cni.join(CNI_SETTINGS_FILE).exists());
        let kept = out.kept.join("; ");
        assert!(
            kept.contains(&format!(
                "macvtap {held_link} on eth0 (device eth0Mvp3, held by a pod)"
            )),
            "{kept}"
        );
        assert!(
            kept.contains("eth0Mvp5 on eth0 (device eth0Mvp5, held by a pod)"),
            "{kept}"
        );
        assert!(kept.contains("pods hold 2 of our devices"), "{kept}");
    }

    #[test]
    fn a_link_handed_out_within_the_grace_is_kept() {
        let n = Node::new();
        let just = link_name_for_device("eth0Mvp6");
        let old = link_name_for_device("eth0Mvp7");
        n.macvtap(&just, "eth0");
        n.macvtap(&old, "eth0");
        let clock = AllocationClock::default();
        let t0 = Instant::now();
        clock.allocated(&just, t0);
        clock.allocated(&old, t0);
        let out = n.clean(&held(&[]), &clock, t0 + Duration::from_secs(59));
        assert_eq!(out.links, Vec::<String>::new());
        let out = n.clean(&held(&[]), &clock, t0 + Duration::from_secs(61));
        assert_eq!(out.links.len(), 2, "{out:?}");
        // Only the first clean saw them within the grace.
        let n = Node::new();
        n.macvtap(&just, "eth0");
        let out = n.clean(&held(&[]), &clock, t0 + Duration::from_secs(1));
        assert!(
            out.kept
                .iter()
                .any(|k| k.contains("within the reclaim grace")),
            "{:?}",
            out.kept
        );
    }

    #[test]
    fn links_of_another_install_on_another_nic_are_left_alone() {
        let n = Node::new();
        let other = link_name_for_device("eth9Mvp0");
        n.macvtap(&other, "eth9");
        n.macvtap("eth9Mvp1", "eth9");
        n.macvtap("eth0Mvp1", "eth9");
        let out = n.clean(&held(&[]), &AllocationClock::default(), Instant::now());
        assert_eq!(out.links, Vec::<String>::new());
        assert_eq!(out.kept.len(), 3, "{:?}", out.kept);
        assert!(
            out.kept
                .iter()
                .all(|k| k.contains("not on a NIC of this daemon's configuration")),
            "{:?}",
            out.kept
        );
    }

    #[test]
    fn nothing_is_deleted_when_the_kubelet_cannot_say_what_pods_hold() {
        let n = Node::new();
        n.macvtap(&link_name_for_device("eth0Mvp0"), "eth0");
        let out = n.clean(
            &Held::Unknown("no socket".into()),
            &AllocationClock::default(),
            Instant::now(),
        );
        assert!(out.links.is_empty());
        assert!(n.cni.join("macvtap").exists() && n.cni.join(CNI_SETTINGS_FILE).exists());
        assert_eq!(out.kept.len(), 2, "{:?}", out.kept);
        assert!(!record_file::path_in(&n.plugin_dir).exists());
    }

    #[test]
    fn cni_files_that_are_not_provably_ours_stay_and_nothing_is_followed() {
        let mut n = Node::new();
        // Another binary where ours was, and a link to Multus' shim where
        // the settings were.
        std::fs::write(n.cni.join("macvtap"), b"someone else's").unwrap();
        let shim = n.cni.join("multus-shim");
        std::fs::write(&shim, b"shim").unwrap();
        std::fs::remove_file(n.cni.join(CNI_SETTINGS_FILE)).unwrap();
        std::os::unix::fs::symlink(&shim, n.cni.join(CNI_SETTINGS_FILE)).unwrap();
        // Found so when the daemon started.
        n.found = CniStamps::read(&n.cni, "macvtap");
        let out = n.clean(&held(&[]), &AllocationClock::default(), Instant::now());
        assert_eq!(std::fs::read(&shim).unwrap(), b"shim");
        assert!(n.cni.join("macvtap").exists());
        assert!(n.cni.join(CNI_SETTINGS_FILE).symlink_metadata().is_ok());
        let kept = out.kept.join("; ");
        assert!(kept.contains("not the binary this image ships"), "{kept}");
        assert!(kept.contains("symbolic link"), "{kept}");
        // A FIFO does not block the clean-up.
        std::fs::remove_file(n.cni.join("macvtap")).unwrap();
        nix::unistd::mkfifo(&n.cni.join("macvtap"), Mode::from_bits_truncate(0o600)).unwrap();
        n.found = CniStamps::read(&n.cni, "macvtap");
        let out = n.clean(&held(&[]), &AllocationClock::default(), Instant::now());
        assert!(
            out.kept.join("; ").contains("not a regular file"),
            "{:?}",
            out.kept
        );
    }

    /// Finding 4 of issue 44: an Allocate still on its blocking thread when
    /// the uninstall starts makes its link after the clean-up would have
    /// listed the links, and its record write would re-create the removed
    /// record. The clean-up closes the gate first (which waits for it) and
    /// the record's keeper, then lists: the link is seen (and kept, as just
    /// handed out), and nothing writes the record after its removal.
    #[test]
    fn the_clean_up_waits_for_an_allocate_under_way_and_nothing_writes_the_record_after() {
        use crate::core::inflight::{Closed, InFlight};
        use crate::core::ledger::Assignments;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let n = Node::new();
        let record = record_file::path_in(&n.plugin_dir);
        let assignments = Assignments::persisted(
            &n.plugin_dir,
            std::sync::Arc::new(crate::core::report::Silent),
        );
        let clock = AllocationClock::default();
        let gate = InFlight::default();
        let pass = rt.block_on(gate.enter()).expect("the gate is open");
        let made = link_name_for_device("eth0Mvp0");
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (n_ref, clock_ref, assignments_ref, made_ref) = (&n, &clock, &assignments, &made);
        std::thread::scope(|s| {
            s.spawn(move || {
                let _pass = pass;
                wait.recv().unwrap();
                clock_ref.allocated(made_ref, Instant::now());
                n_ref.macvtap(made_ref, "eth0");
                assignments_ref.handed_out("eth0", &[("eth0Mvp0", 40)]);
            });
            rt.block_on(async {
                // Moved in, so a failure here drops it and the Allocate's
                // thread ends instead of waiting for ever.
                let go = go;
                let closing = gate.close(Duration::from_secs(600));
                tokio::pin!(closing);
                tokio::select! {
                    biased;
                    c = &mut closing => panic!("closed while an Allocate holds a pass: {c:?}"),
                    () = tokio::task::yield_now() => {}
                }
                go.send(()).unwrap();
                assert_eq!(closing.await, Closed::Settled);
            });
        });
        assert!(
            rt.block_on(gate.enter()).is_none(),
            "an Allocate after the close"
        );
        assignments.close();
        let out = n.clean(&held(&[]), &clock, Instant::now());
        assert!(
            out.kept
                .iter()
                .any(|k| k.contains(&made) && k.contains("within the reclaim grace")),
            "the link made under way was not seen: {out:?}"
        );
        assert!(!record.parent().unwrap().exists(), "{out:?}");
        assignments.handed_out("eth0", &[("eth0Mvp1", 41)]);
        assert!(
            !record.parent().unwrap().exists(),
            "a write after the clean-up re-created the record"
        );
    }
}
