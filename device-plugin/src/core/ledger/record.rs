//! The record of handed-out devices: the ifindex each device's macvtap
//! had when it was last handed out, kept in memory for heal and, in the
//! daemon, in a file that outlives it ([`super::record_file`]).

use super::record_file;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use tracing::{info, warn};

/// The ifindex each device's macvtap had when Allocate last handed it out
/// (so its pod's containers get `/dev/tap<ifindex>`), with its resource's
/// short name. Written by the plugin servers, read by the healer; when made
/// with `Assignments::persisted`, every new assignment is also appended
/// to the record's journal ([`super::record_file`]) before it is
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
    pub(crate) fn persisted(path: PathBuf) -> Self {
        let mut by_device = HashMap::new();
        match record_file::load_all(&path) {
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
    #[cfg(test)]
    pub(crate) fn assigned(&self, device_id: &str, resource: &str, ifindex: u32) {
        self.insert_logged(resource, &[(device_id, ifindex)]);
    }

    /// Records the devices `got` (device ID, the ifindex its link was made or
    /// reused with) handed out for `resource`, before the answer leaves.
    pub(crate) fn handed_out(&self, resource: &str, got: &[(&str, u32)]) {
        self.insert_logged(resource, got);
    }

    /// Forgets each device for which `keep` says false; the record is
    /// rewritten without them (a compaction).
    pub(crate) fn retain(&self, keep: impl Fn(&str, &Assigned) -> bool) {
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

    /// Stops writing the file: assignments from now on are kept in memory
    /// only. Waits for an append or compaction under way, so once this
    /// returns nothing of this daemon writes (or re-creates) the record: an
    /// uninstall calls it before it removes the record.
    pub(crate) fn close(&self) {
        let _io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).file = None;
    }

    /// Where `device_id` was handed out, if this daemon (or one before it,
    /// per the file) handed it out.
    pub(crate) fn get(&self, device_id: &str) -> Option<Assigned> {
        let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.by_device.get(device_id).cloned()
    }

    /// How many devices are recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.by_device.len()
    }

    /// Whether no device is recorded.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
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
                    match record_file::journal_line(record_file::Entry {
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
            record_file::append(&path, &lines)
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
        let text = record_file::render(r.by_device.iter().map(|(id, at)| record_file::Entry {
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
    record_file::save(&path, &text)?;
    record_file::clear_journal(&path)
}

/// Starts the thread that, after each write, folds the journal into the
/// record once it is over [`record_file::COMPACT_BYTES`] and flushes
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
                if inner.lock().unwrap_or_else(|e| e.into_inner()).file.is_none() {
                    // Closed: the record is not ours to write any more.
                    continue;
                }
                if record_file::journal_len(&path) > record_file::COMPACT_BYTES {
                    if let Err(e) = compact(&inner, &io) {
                        warn!(error = %e, "cannot fold the journal into the record of handed-out devices");
                    }
                }
                if let Err(e) = record_file::flush(&path) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let journal = record_file::journal_path(&path);
        let len = record_file::journal_len(&path);
        c.assigned("dpMvp1", "dp", 45);
        c.retain(|_, _| true);
        assert!(!path.exists());
        assert_eq!(record_file::journal_len(&path), len);
        c.assigned("dpMvp1", "dp", 46);
        assert!(record_file::journal_len(&path) > len, "{journal:?}");
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
        let one = record_file::journal_len(&path);
        a.assigned("dpMvp1", "dp", 41);
        // Each new assignment costs one line, whatever the record holds.
        assert_eq!(record_file::journal_len(&path), 2 * one);
        assert!(!path.exists(), "the record is not rewritten per Allocate");
        // Forgetting compacts: the record holds what memory holds, the
        // journal is empty, and a new daemon reads the same.
        a.retain(|id, _| id != "dpMvp0");
        assert_eq!(record_file::journal_len(&path), 0);
        let base = record_file::load(&path).unwrap().unwrap();
        assert_eq!(base.devices.keys().collect::<Vec<_>>(), ["dpMvp1"]);
        // A line cut short by a kill is dropped, the others kept.
        a.assigned("dpMvp2", "dp", 42);
        let journal = record_file::journal_path(&path);
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
        std::fs::create_dir(record_file::journal_path(&path)).unwrap();
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
}
