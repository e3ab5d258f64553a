//! Lost links: a device that PodResources says a pod holds, but whose
//! macvtap exists nowhere. A pod's network namespace destroyed without CNI
//! DEL takes the macvtap with it, and the kubelet keeps handing the pod's
//! containers the `/dev/tap<N>` of the first Allocate. When no link of the
//! device's name is in the host namespace and `/dev/tap<N>` is gone
//! (devtmpfs keeps a tap node as long as its macvtap exists in any
//! namespace, but for the moment the macvtap moves between two: CNI ADD and
//! DEL move it, so each device is looked at again once moves in flight have
//! ended), the macvtap is created again on the resource's NIC with ifindex
//! N, so the sandbox's retried CNI ADD works and the kubelet's DeviceSpec
//! is right again. Each reclaim round ([`crate::reclaim`]) heals first; a
//! tap node's deletion in `/dev` starts a round at once.

use crate::assignment_file;
use crate::config::ResourceConfig;
use crate::core::host::Host;
use crate::core::link::{Recreated, recreate_device};
use crate::error::{Error, Result};
use macvtap_link::tapdev::tap_node_path;
use macvtap_link::{Link, LinkChange, Links, link_name_for_device};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use tracing::{debug, info, warn};

/// The ifindex each device's macvtap had when Allocate last handed it out
/// (so its pod's containers get `/dev/tap<ifindex>`), with its resource's
/// short name. Written by the plugin servers, read by the healer; when made
/// with [`Assignments::persisted`], every new assignment is also appended
/// to the record's journal ([`crate::assignment_file`]) before it is
/// answered, so a restarted daemon heals what the previous one handed out;
/// a thread of its own then flushes it to disk and folds the journal into
/// the record when it has grown, off the Allocate's path.
#[derive(Debug, Clone, Default)]
pub struct Assignments {
    inner: Arc<Mutex<Record>>,
    /// Held while the files are written, so an append and a compaction
    /// never interleave.
    io: Arc<Mutex<()>>,
    /// Wakes the flushing thread after a write (none without a file).
    flush: Option<mpsc::Sender<()>>,
}

#[derive(Debug, Default)]
struct Record {
    by_device: HashMap<String, Assigned>,
    file: Option<PathBuf>,
}

/// Where a device's macvtap was when it was handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The resource's short name (`dataplane`).
    pub resource: String,
    /// The ifindex, i.e. the N of `/dev/tapN` in the DeviceSpec.
    pub ifindex: u32,
}

impl Assignments {
    /// Assignments kept in the file at `path` as well, starting from what it
    /// holds (nothing when it is missing; what is invalid in it is dropped,
    /// with a warning).
    pub fn persisted(path: PathBuf) -> Self {
        let mut by_device = HashMap::new();
        match assignment_file::load_all(&path) {
            Ok(None) => {}
            Ok(Some(parsed)) => {
                for why in &parsed.dropped {
                    warn!(file = %path.display(), dropped = %why,
                        "ignoring part of the record of handed-out devices; a lost link of such a device is not healed");
                }
                for (id, (resource, ifindex)) in parsed.devices {
                    by_device.insert(id, Assigned { resource, ifindex });
                }
                info!(file = %path.display(), devices = by_device.len(), "read the record of handed-out devices");
            }
            Err(e) => warn!(error = %e,
                "cannot read the record of handed-out devices; starting without it (a lost link handed out before this start is not healed)"),
        }
        let inner = Arc::new(Mutex::new(Record {
            by_device,
            file: Some(path.clone()),
        }));
        let io = Arc::new(Mutex::new(()));
        Self {
            flush: spawn_flusher(path, inner.clone(), io.clone()),
            inner,
            io,
        }
    }

    /// Records that `device_id` of `resource` was handed out as `/dev/tap<ifindex>`.
    pub fn assigned(&self, device_id: &str, resource: &str, ifindex: u32) {
        self.insert_logged(resource, &[(device_id, ifindex)]);
    }

    /// Records the devices `got` (device ID, the ifindex its link was made or
    /// reused with) handed out for `resource`, before the answer leaves.
    pub fn handed_out(&self, resource: &str, got: &[(&str, u32)]) {
        self.insert_logged(resource, got);
    }

    /// Forgets each device for which `keep` says false; the record is
    /// rewritten without them (a compaction).
    pub fn retain(&self, keep: impl Fn(&str, &Assigned) -> bool) {
        let changed = {
            let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let before = r.by_device.len();
            r.by_device.retain(|id, at| keep(id, at));
            r.by_device.len() != before
        };
        if changed {
            if let Err(e) = compact(&self.inner, &self.io) {
                warn!(error = %e, "cannot rewrite the record of handed-out devices; a restarted daemon may heal a forgotten device's link");
            }
            self.wake_flusher();
        }
    }

    /// Where `device_id` was handed out, if this daemon (or one before it,
    /// per the file) handed it out.
    pub fn get(&self, device_id: &str) -> Option<Assigned> {
        let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.by_device.get(device_id).cloned()
    }

    /// How many devices are recorded.
    pub fn len(&self) -> usize {
        let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.by_device.len()
    }

    /// Whether no device is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inserts `got` (device ID, ifindex) of `resource`; those new or
    /// changed are appended to the journal in one write before this returns.
    fn insert_logged(&self, resource: &str, got: &[(&str, u32)]) {
        let (path, lines) = {
            let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let mut lines = Vec::new();
            let mut unencoded = None;
            for (id, ifindex) in got {
                if insert(&mut r.by_device, id, resource, *ifindex) {
                    match assignment_file::journal_line(assignment_file::Entry {
                        device_id: id,
                        resource,
                        ifindex: *ifindex,
                    }) {
                        Ok(line) => lines.extend(line),
                        Err(e) => unencoded = Some(e),
                    }
                }
            }
            match (&r.file, unencoded, lines.is_empty()) {
                (Some(path), Some(e), _) => {
                    warn!(error = %Error::io("encoding a journal line of handed-out devices", path)(e),
                        "cannot write the record of handed-out devices: a daemon restarted later will not heal the lost links of devices handed out since");
                    return;
                }
                (Some(path), None, false) => (path.clone(), lines),
                _ => return,
            }
        };
        let appended = {
            let _io = self.io.lock().unwrap_or_else(|e| e.into_inner());
            assignment_file::append(&path, &lines)
        };
        match appended {
            Ok(()) => self.wake_flusher(),
            Err(e) => warn!(error = %e,
                "cannot write the record of handed-out devices: a daemon restarted later will not heal the lost links of devices handed out since"),
        }
    }

    fn wake_flusher(&self) {
        if let Some(f) = &self.flush {
            let _ = f.send(());
        }
    }
}

/// Folds the journal into the record: the record rewritten whole from what
/// `inner` holds, then the journal emptied, with the files' lock `io` held.
fn compact(inner: &Mutex<Record>, io: &Mutex<()>) -> Result<()> {
    let _io = io.lock().unwrap_or_else(|e| e.into_inner());
    let (path, text) = {
        let r = inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(path) = r.file.clone() else {
            return Ok(());
        };
        let text =
            assignment_file::render(r.by_device.iter().map(|(id, at)| assignment_file::Entry {
                device_id: id,
                resource: &at.resource,
                ifindex: at.ifindex,
            }))
            .map_err(Error::io(
                "encoding the record of handed-out devices",
                &path,
            ))?;
        (path, text)
    };
    assignment_file::save(&path, &text)?;
    assignment_file::clear_journal(&path)
}

/// Starts the thread that, after each write, folds the journal into the
/// record once it is over [`assignment_file::COMPACT_BYTES`] and flushes
/// the files to disk (writes that come meanwhile share the next round); it
/// ends when every [`Assignments`] sharing it is gone. `None` (and a
/// warning) when no thread can start: the writes still outlive the process.
fn spawn_flusher(
    path: PathBuf,
    inner: Arc<Mutex<Record>>,
    io: Arc<Mutex<()>>,
) -> Option<mpsc::Sender<()>> {
    let (tx, rx) = mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("record-flush".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                while rx.try_recv().is_ok() {}
                if assignment_file::journal_len(&path) > assignment_file::COMPACT_BYTES {
                    if let Err(e) = compact(&inner, &io) {
                        warn!(error = %e, "cannot fold the journal into the record of handed-out devices");
                    }
                }
                if let Err(e) = assignment_file::flush(&path) {
                    warn!(error = %e, "cannot flush the record of handed-out devices to disk");
                }
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            warn!(error = %e, "cannot start the thread that flushes the record of handed-out devices; it is written but not flushed");
            None
        }
    }
}

/// Inserts one assignment; true when it changed the map.
fn insert(m: &mut HashMap<String, Assigned>, id: &str, resource: &str, ifindex: u32) -> bool {
    let new = Assigned {
        resource: resource.to_string(),
        ifindex,
    };
    if m.get(id) == Some(&new) {
        return false;
    }
    m.insert(id.to_string(), new);
    true
}

/// A device to heal: held by a pod, its macvtap gone everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// The device ID.
    pub device_id: String,
    /// Where it was handed out.
    pub at: Assigned,
}

/// The devices that a pod holds (`allocated`) and that were handed out by
/// this daemon (`assignments`), whose link is not in the host namespace
/// (`links`) and whose tap node no longer exists (`node_exists`).
pub fn lost_devices(
    allocated: &HashSet<String>,
    assignments: &Assignments,
    links: &[Link],
    node_exists: impl Fn(u32) -> bool,
) -> Vec<Lost> {
    let host_names: HashSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
    let mut lost: Vec<Lost> = allocated
        .iter()
        .filter_map(|id| Some((id, assignments.get(id)?)))
        .filter(|(id, _)| !host_names.contains(link_name_for_device(id).as_str()))
        .filter(|(_, at)| !node_exists(at.ifindex))
        .map(|(id, at)| Lost {
            device_id: id.clone(),
            at,
        })
        .collect();
    lost.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    lost
}

/// Re-creates each lost device's macvtap with its old ifindex; returns how
/// many came back. A device whose ifindex is taken on the host by another
/// link, or whose resource or NIC is gone, is logged and left.
///
/// `lost` was judged from links listed before the kubelet answered and a
/// tap node looked at after, and a macvtap moving between namespaces is in
/// neither and has no node for that moment (devtmpfs deletes it and makes
/// it again): so each device is looked at again first, after every move in
/// flight has ended ([`settle`]), and one whose link is on the host or whose
/// node exists is not lost. A link made while the device's own moved into a
/// pod gets no node (the name is the other's) and is deleted at once.
pub fn heal(host: &Host, lost: &[Lost], resources: &[ResourceConfig]) -> Result<u64> {
    let handle = host.links();
    let mut healed = 0;
    for l in lost {
        let Some(cfg) = resources.iter().find(|r| r.name == l.at.resource) else {
            warn!(device_id = %l.device_id, resource = %l.at.resource,
                "a pod holds this device but its macvtap is gone, and its resource is no longer configured: not re-created");
            continue;
        };
        let Some(lower) = handle.get_link(&cfg.lower_device)? else {
            warn!(device_id = %l.device_id, lower = %cfg.lower_device,
                "a pod holds this device but its macvtap is gone, and so is its NIC: not re-created");
            continue;
        };
        let name = link_name_for_device(&l.device_id);
        let node = tap_node_path(host.paths().dev(), l.at.ifindex);
        if let Err(e) = settle(handle, &lower) {
            warn!(device_id = %l.device_id, error = %e,
                "cannot wait for link changes in flight, so cannot tell whether the device's macvtap is lost: not re-created now");
            continue;
        }
        if let Some(why) = still_there(host, &name, l.at.ifindex, &node)? {
            debug!(device_id = %l.device_id, ifname = %name, ifindex = l.at.ifindex, why,
                "not lost after all: its link was moving between namespaces when the round looked");
            continue;
        }
        match recreate_device(host, cfg, &lower, &l.device_id, l.at.ifindex) {
            Ok(Recreated::Made(link)) => {
                healed += 1;
                info!(device_id = %l.device_id, ifname = %link.name, ifindex = link.index,
                    "re-created the macvtap of a device a pod still holds (its namespace went without CNI DEL), so the sandbox's retried ADD finds it");
            }
            Ok(Recreated::NodeElsewhere) => {
                debug!(device_id = %l.device_id, ifname = %name, ifindex = l.at.ifindex,
                    "not lost after all: its link moved into a pod meanwhile and has /dev/tap{}; the link made for it is deleted again", l.at.ifindex);
            }
            Err(e) => {
                warn!(device_id = %l.device_id, error = %e, "could not re-create a lost macvtap")
            }
        }
    }
    Ok(healed)
}

/// Returns once every link change in flight on the node has ended: a move
/// between namespaces holds the kernel's RTNL lock from start to end, and a
/// change request (here one that changes nothing on `lower`) waits for it.
fn settle(handle: &dyn Links, lower: &Link) -> Result<()> {
    handle.set_link(lower.index, &lower.name, &LinkChange::default())?;
    Ok(())
}

/// Why the device whose link is `name` with ifindex `index` (tap node
/// `node`) is not lost, read now: its link is on the host, or its node
/// exists (its link is in a pod's namespace), or another link holds the
/// index on the host (logged: the device cannot come back). `None` when
/// it is lost.
fn still_there(host: &Host, name: &str, index: u32, node: &Path) -> Result<Option<&'static str>> {
    let handle = host.links();
    if handle.get_link(name)?.is_some() {
        return Ok(Some("its link is on the node"));
    }
    if !matches!(host.kernel().tap_node(node), Ok(None)) {
        return Ok(Some(
            "its tap node exists: the link is in a pod's namespace",
        ));
    }
    match handle.get_link_by_index(index)? {
        Some(other) if other.name == name => Ok(Some("its link is on the node")),
        Some(other) => {
            warn!(ifname = %name, ifindex = index, other = %other.name,
                "a pod holds this device but its macvtap is gone, and its ifindex is now taken on the host by another link, so /dev/tap{} cannot come back: the pod needs to be re-created", index);
            Ok(Some("its ifindex is taken by another link"))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::{Kernel, MacvtapMode, Op};
    use test_support::fake::{FakeKernel, HOST, link};

    #[test]
    fn lost_devices_are_held_handed_out_and_gone_everywhere() {
        let a = Assignments::default();
        a.assigned("dpMvp1", "dp", 40);
        a.assigned("dpMvp2", "dp", 41);
        a.assigned("dpMvp3", "dp", 42);
        a.assigned("dpMvp4", "dp", 43);
        let allocated: HashSet<String> = ["dpMvp1", "dpMvp2", "dpMvp3", "dpMvp5"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        // dpMvp1: its link is on the host (returned by DEL, or not yet moved).
        let links = vec![link(
            40,
            &link_name_for_device("dpMvp1"),
            "macvtap",
            Some(2),
        )];
        // dpMvp2: its tap node exists, so the link lives in some pod.
        let lost = lost_devices(&allocated, &a, &links, |i| i == 41);
        // dpMvp3 is lost; dpMvp4 is held by no pod; dpMvp5 was never handed out here.
        assert_eq!(
            lost,
            vec![Lost {
                device_id: "dpMvp3".into(),
                at: Assigned {
                    resource: "dp".into(),
                    ifindex: 42
                }
            }]
        );
    }

    #[test]
    fn a_persisted_record_is_what_the_next_daemon_starts_from() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/assignments.json");
        let a = Assignments::persisted(path.clone());
        assert!(a.is_empty());
        a.handed_out("dp", &[("dpMvp0", 40), ("dpMvp1", 41)]);
        a.assigned("dpMvp1", "dp", 45);
        // A new daemon reads what the old one handed out, last answer first.
        let b = Assignments::persisted(path.clone());
        assert_eq!(b.len(), 2);
        assert_eq!(
            b.get("dpMvp0"),
            Some(Assigned {
                resource: "dp".into(),
                ifindex: 40
            })
        );
        assert_eq!(b.get("dpMvp1").unwrap().ifindex, 45);
        b.retain(|id, _| id != "dpMvp0");
        let c = Assignments::persisted(path.clone());
        assert_eq!(
            (c.len(), c.get("dpMvp0")),
            (1, None),
            "forgotten in the file too"
        );
        // An unchanged record is not written again: neither the journal
        // nor the record.
        std::fs::remove_file(&path).unwrap();
        let journal = assignment_file::journal_path(&path);
        let len = assignment_file::journal_len(&path);
        c.assigned("dpMvp1", "dp", 45);
        c.retain(|_, _| true);
        assert!(!path.exists());
        assert_eq!(assignment_file::journal_len(&path), len);
        c.assigned("dpMvp1", "dp", 46);
        assert!(assignment_file::journal_len(&path) > len, "{journal:?}");
        assert_eq!(
            Assignments::persisted(path.clone())
                .get("dpMvp1")
                .unwrap()
                .ifindex,
            46
        );
    }

    #[test]
    fn an_allocate_appends_one_line_and_a_compaction_folds_the_journal_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("assignments.json");
        let a = Assignments::persisted(path.clone());
        a.assigned("dpMvp0", "dp", 40);
        let one = assignment_file::journal_len(&path);
        a.assigned("dpMvp1", "dp", 41);
        // Each new assignment costs one line, whatever the record holds.
        assert_eq!(assignment_file::journal_len(&path), 2 * one);
        assert!(!path.exists(), "the record is not rewritten per Allocate");
        // Forgetting compacts: the record holds what memory holds, the
        // journal is empty, and a new daemon reads the same.
        a.retain(|id, _| id != "dpMvp0");
        assert_eq!(assignment_file::journal_len(&path), 0);
        let base = assignment_file::load(&path).unwrap().unwrap();
        assert_eq!(base.devices.keys().collect::<Vec<_>>(), ["dpMvp1"]);
        // A line cut short by a kill is dropped, the others kept.
        a.assigned("dpMvp2", "dp", 42);
        let journal = assignment_file::journal_path(&path);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&journal)
            .unwrap();
        std::io::Write::write_all(&mut f, b"{\"deviceID\":\"dpMvp3\",\"reso").unwrap();
        let b = Assignments::persisted(path.clone());
        assert_eq!(b.len(), 2);
        assert_eq!(b.get("dpMvp2").unwrap().ifindex, 42);
        assert_eq!(b.get("dpMvp3"), None);
    }

    #[test]
    fn concurrent_allocates_all_land_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("assignments.json");
        let a = Assignments::persisted(path.clone());
        std::thread::scope(|s| {
            for t in 0..8u32 {
                let a = a.clone();
                s.spawn(move || {
                    for i in 0..5 {
                        a.assigned(&format!("dpMvp{}", t * 5 + i), "dp", 100 + t * 5 + i);
                    }
                });
            }
        });
        let b = Assignments::persisted(path);
        assert_eq!(b.len(), 40);
        assert_eq!(b.get("dpMvp39").unwrap().ifindex, 139);
    }

    #[test]
    fn a_corrupt_or_unwritable_record_leaves_healing_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("assignments.json");
        std::fs::write(&path, "{\"version\":1,\"devi").unwrap();
        let a = Assignments::persisted(path.clone());
        assert!(a.is_empty());
        // Directories where the files should be: the writes fail, memory holds.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::create_dir(assignment_file::journal_path(&path)).unwrap();
        a.assigned("dpMvp0", "dp", 40);
        a.assigned("dpMvp1", "dp", 41);
        a.retain(|id, _| id != "dpMvp1");
        assert_eq!(a.get("dpMvp0").unwrap().ifindex, 40);
        assert_eq!(a.get("dpMvp1"), None);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["assignments.journal", "assignments.json"],
            "no temporary file left"
        );
    }

    /// The host's file systems with an empty `/dev` at `dev`.
    fn dev_at(dev: &tempfile::TempDir) -> crate::core::host::HostPaths {
        crate::core::host::HostPaths {
            dev: dev.path().to_path_buf(),
            ..Default::default()
        }
    }

    /// A node whose pod holds `dpMvp1` of resource `dp` on `lower0`, handed
    /// out as `/dev/tap40`, with an empty `/dev`.
    fn held_device() -> (
        FakeKernel,
        Vec<Lost>,
        Vec<ResourceConfig>,
        tempfile::TempDir,
    ) {
        let kernel = FakeKernel::new();
        kernel.add_nic(HOST, "lower0");
        let lost = vec![Lost {
            device_id: "dpMvp1".into(),
            at: Assigned {
                resource: "dp".into(),
                ifindex: 40,
            },
        }];
        let resources = vec![ResourceConfig {
            name: "dp".into(),
            ..ResourceConfig::for_nic("lower0")
        }];
        (kernel, lost, resources, tempfile::tempdir().unwrap())
    }

    #[test]
    fn a_held_devices_lost_link_comes_back_with_its_ifindex() {
        let (kernel, lost, resources, dev) = held_device();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(heal(&host, &lost, &resources).unwrap(), 1);
        let link = kernel
            .link(HOST, &link_name_for_device("dpMvp1"))
            .expect("re-created");
        assert_eq!(link.index, 40, "the /dev/tap40 the kubelet hands out");
        assert!(link.is_macvtap());
        assert_eq!(link.macvtap_mode, Some(MacvtapMode::Bridge));
        let lower = kernel.link(HOST, "lower0").unwrap();
        assert_eq!(link.lower_index, Some(lower.index));
        assert_eq!(link.txqueuelen, lower.txqueuelen);
    }

    #[test]
    fn nothing_is_made_when_the_link_or_its_node_is_still_there() {
        let (kernel, _, _, dev) = held_device();
        let a = Assignments::default();
        a.assigned("dpMvp1", "dp", 40);
        let allocated = HashSet::from(["dpMvp1".to_string()]);
        // The link is on the host (given back by DEL, or not yet moved).
        let host = Host::current(&kernel).unwrap();
        let lower = kernel.link(HOST, "lower0").unwrap();
        host.links()
            .add_macvtap_at(
                &link_name_for_device("dpMvp1"),
                lower.index,
                MacvtapMode::Bridge,
                None,
                Some(40),
            )
            .unwrap();
        let links = host.links().list_links().unwrap();
        let node_exists = |i: u32| dev.path().join(format!("tap{i}")).exists();
        assert_eq!(lost_devices(&allocated, &a, &links, node_exists), []);
        // The link is in some pod's namespace: its tap node still exists.
        kernel.add_netns("/run/netns/pod");
        let pod = kernel.open_netns(Path::new("/run/netns/pod")).unwrap();
        host.links()
            .set_link_ns(40, &link_name_for_device("dpMvp1"), &pod, "net1")
            .unwrap();
        std::fs::write(dev.path().join("tap40"), "").unwrap();
        let links = host.links().list_links().unwrap();
        assert_eq!(lost_devices(&allocated, &a, &links, node_exists), []);
        assert_eq!(kernel.count(Op::AddMacvtap), 1, "only the set-up's");
    }

    /// What `f` logs, as text.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || out.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Issue 37, seed 1796164578509130593: the round listed the links while
    /// the device's was in a pod and looked at `/dev/tapN` while DEL moved
    /// it back; by the time heal runs, the link is on the host at its
    /// ifindex. Heal took the device's own link for another holding the
    /// index and warned that the pod must be re-created.
    #[test]
    fn a_link_back_on_the_host_is_not_lost_and_not_another_link_in_the_way() {
        let (kernel, lost, resources, dev) = held_device();
        let lower = kernel.link(HOST, "lower0").unwrap();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        host.links()
            .add_macvtap_at(
                &link_name_for_device("dpMvp1"),
                lower.index,
                MacvtapMode::Bridge,
                None,
                Some(40),
            )
            .unwrap();
        let log = logged(|| {
            assert_eq!(heal(&host, &lost, &resources).unwrap(), 0);
        });
        assert!(!log.contains("taken on the host"), "{log}");
        assert!(log.contains("not lost after all"), "{log}");
        assert_eq!(
            kernel.count(Op::AddMacvtap),
            1,
            "only the one back from the pod"
        );
    }

    /// The round looked while the device's link moved into a pod (no node
    /// for that moment), and heal runs once it is there: nothing is made,
    /// since a second link with its ifindex on the host would get no node
    /// and make CNI DEL delete the pod's link as in the way.
    #[test]
    fn a_link_that_moved_into_a_pod_is_not_made_again_on_the_host() {
        let (kernel, lost, resources, dev) = held_device();
        let lower = kernel.link(HOST, "lower0").unwrap();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        let name = link_name_for_device("dpMvp1");
        host.links()
            .add_macvtap_at(&name, lower.index, MacvtapMode::Bridge, None, Some(40))
            .unwrap();
        kernel.add_netns("/run/netns/pod");
        let pod = kernel.open_netns(Path::new("/run/netns/pod")).unwrap();
        host.links().set_link_ns(40, &name, &pod, "net1").unwrap();
        assert_eq!(heal(&host, &lost, &resources).unwrap(), 0);
        assert_eq!(kernel.links_of(HOST).len(), 1, "only the NIC on the host");
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
    }

    #[test]
    fn a_device_is_left_when_moves_in_flight_cannot_be_waited_for() {
        let (kernel, lost, resources, dev) = held_device();
        kernel.fail(Op::SetLink, 1, nix::errno::Errno::EIO);
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(heal(&host, &lost, &resources).unwrap(), 0);
        assert_eq!(kernel.count(Op::AddMacvtap), 0);
        // The next round waits, looks again and heals it.
        assert_eq!(heal(&host, &lost, &resources).unwrap(), 1);
    }

    #[test]
    fn a_taken_ifindex_a_gone_nic_or_resource_leave_the_device_alone() {
        // Another link has the ifindex now.
        let (kernel, lost, resources, dev) = held_device();
        kernel.insert_link(
            HOST,
            Link {
                index: 40,
                name: "veth9".into(),
                ..Default::default()
            },
        );
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(heal(&host, &lost, &resources).unwrap(), 0);
        // The NIC is gone.
        let (kernel, lost, _, dev) = held_device();
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        let elsewhere = vec![ResourceConfig {
            name: "dp".into(),
            ..ResourceConfig::for_nic("lower9")
        }];
        assert_eq!(heal(&host, &lost, &elsewhere).unwrap(), 0);
        // The resource is no longer configured.
        assert_eq!(heal(&host, &lost, &[]).unwrap(), 0);
        assert_eq!(kernel.count(Op::AddMacvtap), 0);
    }

    #[test]
    fn a_recreated_link_whose_node_fails_the_check_is_deleted_again() {
        let (kernel, lost, resources, dev) = held_device();
        kernel.fail(Op::OpenTapNode, 1, nix::errno::Errno::ENOENT);
        let host = Host::current(&kernel).unwrap().with_paths(dev_at(&dev));
        assert_eq!(heal(&host, &lost, &resources).unwrap(), 0);
        assert_eq!(kernel.count(Op::AddMacvtap), 1);
        assert_eq!(kernel.link(HOST, &link_name_for_device("dpMvp1")), None);
    }
}
