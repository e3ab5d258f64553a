//! The record of handed-out devices: the ifindex each device's macvtap
//! had when it was last handed out, kept in memory for heal and, in the
//! daemon, in a file that outlives it ([`super::record_file`]).

use super::record_file::{self, RecordDir};
use crate::core::report::Observer;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
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
    /// The record's files (none when kept in memory only), held while they
    /// are written, so an append and a compaction never interleave.
    files: Option<Arc<Mutex<Files>>>,
    /// Wakes the flushing thread after a write (none without a file).
    flush: Option<mpsc::Sender<()>>,
}

#[derive(Debug, Default)]
struct Record {
    by_device: HashMap<String, Assigned>,
}

/// Where the record is kept: its directory, opened at the first need and
/// then held, and where what was planted there is reported.
struct Files {
    /// The device-plugins directory the record directory is in.
    plugin_dir: PathBuf,
    /// The record directory, once opened.
    dir: Option<Arc<RecordDir>>,
    /// Told of each planted file removed (an Event, in the daemon).
    report: Arc<dyn Observer>,
    /// Closed ([`Assignments::close`]): nothing is written any more.
    closed: bool,
}

impl fmt::Debug for Files {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Files")
            .field("plugin_dir", &self.plugin_dir)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Files {
    /// The record's path, for messages.
    fn record(&self) -> PathBuf {
        record_file::path_in(&self.plugin_dir)
    }

    /// The record directory: the one held, else opened now (and made when
    /// missing) and held from then on. A refused directory is tried again
    /// at the next write, so removing what was in its place needs no
    /// restart.
    fn dir(&mut self) -> Result<Arc<RecordDir>> {
        if let Some(dir) = &self.dir {
            return Ok(dir.clone());
        }
        let dir = Arc::new(RecordDir::open_or_create(&self.plugin_dir)?);
        self.dir = Some(dir.clone());
        Ok(dir)
    }
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
    /// Assignments kept in the record directory under the device-plugins
    /// directory `plugin_dir` as well, starting from what it holds (nothing
    /// when it is missing; what is invalid in it is dropped, with a
    /// warning). What something else planted where the record keeps a file
    /// is removed and told to `report`.
    pub(crate) fn persisted(plugin_dir: &Path, report: Arc<dyn Observer>) -> Self {
        let path = record_file::path_in(plugin_dir);
        let mut by_device = HashMap::new();
        let (dir, loaded) = match RecordDir::open(plugin_dir) {
            Ok(None) => (None, Ok(None)),
            Ok(Some(dir)) => {
                let loaded = record_file::load_all(&dir, report.as_ref());
                (Some(Arc::new(dir)), loaded)
            }
            Err(e) => (None, Err(e)),
        };
        match loaded {
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
        let inner = Arc::new(Mutex::new(Record { by_device }));
        let files = Arc::new(Mutex::new(Files {
            plugin_dir: plugin_dir.to_path_buf(),
            dir,
            report,
            closed: false,
        }));
        Self {
            flush: spawn_flusher(inner.clone(), files.clone()),
            inner,
            files: Some(files),
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
        if let (true, Some(files)) = (changed, &self.files) {
            if let Err(e) = compact(&self.inner, files) {
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
        if let Some(files) = &self.files {
            let mut files = files.lock().unwrap_or_else(|e| e.into_inner());
            files.closed = true;
            files.dir = None;
        }
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
        let (lines, unencoded) = {
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
            (lines, unencoded)
        };
        let Some(files) = &self.files else {
            return;
        };
        let appended = {
            let mut files = files.lock().unwrap_or_else(|e| e.into_inner());
            match unencoded {
                Some(e) => Err(Error::io(
                    "encoding a journal line of handed-out devices",
                    files.record(),
                )(e)),
                None if lines.is_empty() || files.closed => return,
                None => files
                    .dir()
                    .and_then(|dir| record_file::append(&dir, &lines, files.report.as_ref())),
            }
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
/// `inner` holds, then the journal emptied, with the files' lock held.
fn compact(inner: &Mutex<Record>, files: &Mutex<Files>) -> Result<()> {
    let mut files = files.lock().unwrap_or_else(|e| e.into_inner());
    if files.closed {
        return Ok(());
    }
    let text = {
        let r = inner.lock().unwrap_or_else(|e| e.into_inner());
        record_file::render(r.by_device.iter().map(|(id, at)| record_file::Entry {
            device_id: id,
            resource: &at.resource,
            ifindex: at.ifindex,
        }))
        .map_err(Error::io(
            "encoding the record of handed-out devices",
            files.record(),
        ))?
    };
    let dir = files.dir()?;
    record_file::save(&dir, &text, files.report.as_ref())?;
    record_file::clear_journal(&dir, files.report.as_ref())
}

/// Starts the thread that, after each write, folds the journal into the
/// record once it is over [`record_file::COMPACT_BYTES`] and flushes
/// the files to disk (writes that come meanwhile share the next round; the
/// `fsync`s run without the files' lock, so an Allocate's append never
/// waits for one); it ends when every [`Assignments`] sharing it is gone.
/// `None` (and a warning) when no thread can start: the writes still
/// outlive the process.
fn spawn_flusher(inner: Arc<Mutex<Record>>, files: Arc<Mutex<Files>>) -> Option<mpsc::Sender<()>> {
    let (tx, rx) = mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("record-flush".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                while rx.try_recv().is_ok() {}
                let held = files.lock().unwrap_or_else(|e| e.into_inner()).dir.clone();
                let Some(dir) = held else {
                    continue;
                };
                if record_file::journal_len(&dir) > record_file::COMPACT_BYTES {
                    if let Err(e) = compact(&inner, &files) {
                        warn!(error = %e, "cannot fold the journal into the record of handed-out devices");
                    }
                }
                if let Err(e) = record_file::flush(&dir) {
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
    use crate::core::report::{Recorder, Silent};
    use record_file::{FILE_NAME, JOURNAL_NAME, RecordDir, dir_in, path_in};

    /// Assignments kept under the device-plugins directory `plugin_dir`,
    /// telling no one.
    fn persisted(plugin_dir: &Path) -> Assignments {
        Assignments::persisted(plugin_dir, Arc::new(Silent))
    }

    /// The size of the journal under `plugin_dir`.
    fn journal_len(plugin_dir: &Path) -> u64 {
        RecordDir::open(plugin_dir)
            .unwrap()
            .map_or(0, |d| record_file::journal_len(&d))
    }

    /// An uninstall closes the record before removing it: nothing of this
    /// daemon writes it afterwards, not even where no directory was opened
    /// yet (which a write would otherwise make).
    #[test]
    fn a_closed_record_is_kept_in_memory_only_and_makes_no_directory() {
        let plugin = tempfile::tempdir().unwrap();
        let a = persisted(plugin.path());
        a.close();
        a.handed_out("dp", &[("dpMvp0", 40)]);
        a.retain(|_, _| false);
        a.handed_out("dp", &[("dpMvp1", 41)]);
        assert_eq!(a.get("dpMvp1").map(|at| at.ifindex), Some(41));
        let record = record_file::path_in(plugin.path());
        assert!(
            !record.parent().unwrap().exists(),
            "a closed record made its directory"
        );
    }

    #[test]
    fn a_persisted_record_is_what_the_next_daemon_starts_from() {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = tmp.path();
        let path = path_in(plugin);
        let a = persisted(plugin);
        assert!(a.is_empty());
        a.handed_out("dp", &[("dpMvp0", 40), ("dpMvp1", 41)]);
        a.assigned("dpMvp1", "dp", 45);
        // A new daemon reads what the old one handed out, last answer first.
        let b = persisted(plugin);
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
        let c = persisted(plugin);
        assert_eq!(
            (c.len(), c.get("dpMvp0")),
            (1, None),
            "forgotten in the file too"
        );
        // An unchanged record is not written again: neither the journal
        // nor the record.
        std::fs::remove_file(&path).unwrap();
        let len = journal_len(plugin);
        c.assigned("dpMvp1", "dp", 45);
        c.retain(|_, _| true);
        assert!(!path.exists());
        assert_eq!(journal_len(plugin), len);
        c.assigned("dpMvp1", "dp", 46);
        assert!(journal_len(plugin) > len);
        assert_eq!(persisted(plugin).get("dpMvp1").unwrap().ifindex, 46);
    }

    #[test]
    fn an_allocate_appends_one_line_and_a_compaction_folds_the_journal_in() {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = tmp.path();
        let path = path_in(plugin);
        let a = persisted(plugin);
        a.assigned("dpMvp0", "dp", 40);
        let one = journal_len(plugin);
        a.assigned("dpMvp1", "dp", 41);
        // Each new assignment costs one line, whatever the record holds.
        assert_eq!(journal_len(plugin), 2 * one);
        assert!(!path.exists(), "the record is not rewritten per Allocate");
        // Forgetting compacts: the record holds what memory holds, the
        // journal is empty, and a new daemon reads the same.
        a.retain(|id, _| id != "dpMvp0");
        assert_eq!(journal_len(plugin), 0);
        let dir = RecordDir::open(plugin).unwrap().unwrap();
        let base = record_file::load(&dir, &Silent).unwrap().unwrap();
        assert_eq!(base.devices.keys().collect::<Vec<_>>(), ["dpMvp1"]);
        // A line cut short by a kill is dropped, the others kept.
        a.assigned("dpMvp2", "dp", 42);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path.with_file_name(JOURNAL_NAME))
            .unwrap();
        std::io::Write::write_all(&mut f, b"{\"deviceID\":\"dpMvp3\",\"reso").unwrap();
        let b = persisted(plugin);
        assert_eq!(b.len(), 2);
        assert_eq!(b.get("dpMvp2").unwrap().ifindex, 42);
        assert_eq!(b.get("dpMvp3"), None);
    }

    #[test]
    fn concurrent_allocates_all_land_in_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let a = persisted(tmp.path());
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
        let b = persisted(tmp.path());
        assert_eq!(b.len(), 40);
        assert_eq!(b.get("dpMvp39").unwrap().ifindex, 139);
    }

    #[test]
    fn a_corrupt_record_is_read_as_empty() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir_in(tmp.path())).unwrap();
        std::fs::write(path_in(tmp.path()), "{\"version\":1,\"devi").unwrap();
        assert!(persisted(tmp.path()).is_empty());
    }

    #[test]
    fn directories_planted_where_the_files_belong_are_removed_reported_and_written_over() {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = tmp.path();
        let a = Assignments::persisted(plugin, Arc::new(Silent));
        a.assigned("dpMvp9", "dp", 49);
        let path = path_in(plugin);
        let journal = path.with_file_name(JOURNAL_NAME);
        std::fs::remove_file(&journal).unwrap();
        std::fs::create_dir_all(path.join("a/b")).unwrap();
        std::fs::create_dir_all(journal.join("c")).unwrap();
        let report = Arc::new(Recorder::default());
        let a = Assignments::persisted(plugin, report.clone());
        a.assigned("dpMvp0", "dp", 40);
        a.assigned("dpMvp1", "dp", 41);
        a.retain(|id, _| id != "dpMvp1");
        assert_eq!(
            report.lines(),
            [
                format!("planted {} a directory", path.display()),
                format!("planted {} a directory", journal.display()),
            ]
        );
        let mut names: Vec<_> = std::fs::read_dir(dir_in(plugin))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, [JOURNAL_NAME, FILE_NAME], "no temporary file left");
        let b = persisted(plugin);
        assert_eq!((b.len(), b.get("dpMvp0").unwrap().ifindex), (1, 40));
    }

    #[test]
    fn an_allocate_meeting_a_planted_journal_link_is_recorded_and_the_link_reported_once() {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = tmp.path().join("device-plugins");
        let shim = tmp.path().join("multus-shim");
        std::fs::create_dir(&plugin).unwrap();
        std::fs::write(&shim, "ELF").unwrap();
        let report = Arc::new(Recorder::default());
        let a = Assignments::persisted(&plugin, report.clone());
        a.assigned("dpMvp0", "dp", 40);
        let journal = path_in(&plugin).with_file_name(JOURNAL_NAME);
        std::fs::remove_file(&journal).unwrap();
        std::os::unix::fs::symlink(&shim, &journal).unwrap();
        let log = crate::testlog::logged(|| {
            a.assigned("dpMvp1", "dp", 41);
            a.assigned("dpMvp2", "dp", 42);
        });
        assert_eq!(
            std::fs::read(&shim).unwrap(),
            b"ELF",
            "the link was followed"
        );
        assert_eq!(
            report.lines(),
            [format!(
                "planted {} a symbolic link to {:?}",
                journal.display(),
                shim
            )]
        );
        assert_eq!(
            log.matches(&format!("path={}", journal.display())).count(),
            1,
            "{log}"
        );
        // The first record (its journal line went with the link) is lost
        // to a restart; those after the removal are kept.
        let b = persisted(&plugin);
        assert_eq!(
            (
                b.get("dpMvp1").unwrap().ifindex,
                b.get("dpMvp2").unwrap().ifindex
            ),
            (41, 42)
        );
    }

    #[test]
    fn a_refused_record_directory_keeps_healing_in_memory_and_writes_nothing_through_it() {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = tmp.path().join("device-plugins");
        let elsewhere = tmp.path().join("cni-bin");
        std::fs::create_dir(&plugin).unwrap();
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir_in(&plugin)).unwrap();
        let log = crate::testlog::logged(|| {
            let a = persisted(&plugin);
            a.assigned("dpMvp0", "dp", 40);
            a.assigned("dpMvp1", "dp", 41);
            a.retain(|id, _| id != "dpMvp1");
            assert_eq!(a.get("dpMvp0").unwrap().ifindex, 40);
            assert_eq!(a.get("dpMvp1"), None);
        });
        assert_eq!(
            std::fs::read_dir(&elsewhere).unwrap().count(),
            0,
            "written through the link"
        );
        assert!(
            log.contains(&format!(
                "the record directory {} is a symbolic link",
                dir_in(&plugin).display()
            )),
            "{log}"
        );
    }
}
