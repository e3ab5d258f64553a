//! The record of handed-out devices that outlives the daemon: which
//! `/dev/tap<ifindex>` each device was last handed out as, kept in a file so
//! that a restarted daemon (a crash, an upgrade, the DaemonSet's pod
//! replaced) can still heal a held device's lost link ([`crate::core::heal`]).
//!
//! Why a file, and why there: the link cannot carry its own record (heal is
//! for the link that is gone, and a held link sits in a pod's namespace the
//! daemon cannot list); the kubelet's `kubelet_internal_checkpoint` does hold
//! each pod's AllocateResponse, but it is the kubelet's private format (a
//! checksummed JSON whose layout changed between releases, with the
//! responses per container and not per device), not an API. So the daemon
//! keeps its own file in a subdirectory of the device-plugins directory,
//! which the DaemonSet already mounts from the host (so the record survives
//! the pod) and which every kubelet leaves alone: on start the kubelet's
//! device manager deletes the files (older releases) or sockets (newer ones)
//! of `device-plugins/` but skips directories (`removeContents` in
//! `pkg/kubelet/cm/devicemanager/manager.go`).
//!
//! An Allocate appends one line per new assignment to a journal beside the
//! record (`assignments.journal`, `O_APPEND`): a constant cost, where
//! writing the whole record would grow with every device handed out. The
//! record itself is rewritten (compacted: the journal folded in, then
//! emptied) off the Allocate's path, when the journal grows past
//! `COMPACT_BYTES` and whenever devices are forgotten; a reader takes the
//! record, then the journal's lines over it, so a kill between the two
//! steps of a compaction loses nothing. A line cut short by a kill is
//! dropped with a warning.
//!
//! The record is written whole, to a temporary file renamed over the old one:
//! a process that dies at any point (a crash, an OOM kill, the pod
//! replaced) leaves the old record or the new one, never a mix, and what it
//! wrote is in the page cache for the next daemon. `flush` then makes it
//! durable (`fsync` of the file and the directory), off the Allocate's path
//! ([`crate::core::ledger::Assignments`] runs it on a thread of its own): an
//! `fsync` costs milliseconds on a busy disk, and the only failure it guards
//! against, a power loss or kernel crash in the moment after an Allocate,
//! takes the node's links with it anyway. It
//! is read as possibly corrupt (a disk's or another version's doing): it
//! must be under `MAX_BYTES`, each entry must name a device ID of its
//! resource and an ifindex the kernel can give, at most `MAX_ENTRIES` are
//! kept, and anything else is dropped with a warning. A device is written
//! before Allocate answers, so the record is never older than what the
//! kubelet was told.

use crate::error::{Error, Result};
use macvtap_link::device::parse_device_id;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The subdirectory of the device-plugins directory that holds the record.
pub(crate) const STATE_DIR: &str = "macvtap-deviceplugin";
/// The record's file name.
pub(crate) const FILE_NAME: &str = "assignments.json";
/// The largest record read; a bigger file is taken as corrupt.
pub(crate) const MAX_BYTES: u64 = 8 << 20;
/// The most entries kept (the node's total capacity is far below this).
pub(crate) const MAX_ENTRIES: usize = 65_536;
/// The format's version; a file of another version is not read.
const VERSION: u32 = 1;
/// The journal's file name, beside the record.
pub(crate) const JOURNAL_NAME: &str = "assignments.journal";
/// The journal's size past which it is folded into the record.
pub(crate) const COMPACT_BYTES: u64 = 64 << 10;

/// The journal beside the record at `record`.
pub(crate) fn journal_path(record: &Path) -> PathBuf {
    record.with_file_name(JOURNAL_NAME)
}

/// The record's path under the device-plugins directory `plugin_dir`.
pub fn path_in(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join(STATE_DIR).join(FILE_NAME)
}

/// One device as the record holds it: the resource's short name and the
/// ifindex it was handed out with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    /// The device ID (`dpMvp3`).
    pub device_id: &'a str,
    /// The resource's short name (`dp`).
    pub resource: &'a str,
    /// The N of `/dev/tapN`.
    pub ifindex: u32,
}

#[derive(Serialize, Deserialize)]
struct FileEntry {
    #[serde(rename = "deviceID")]
    device_id: String,
    resource: String,
    ifindex: u64,
}

#[derive(Serialize, Deserialize)]
struct RecordFile {
    version: u32,
    devices: Vec<FileEntry>,
}

/// What a record's text holds: the valid entries by device ID, and a
/// sentence for each thing dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// Device ID → (resource, ifindex).
    pub devices: BTreeMap<String, (String, u32)>,
    /// What was dropped, and why.
    pub dropped: Vec<String>,
}

/// Reads the record's text: every entry that names a device of its
/// resource and a valid ifindex, the first of duplicates, at most
/// [`MAX_ENTRIES`]; text that is not a record of this version gives none.
pub(crate) fn parse(text: &[u8]) -> Parsed {
    let mut out = Parsed::default();
    let file: RecordFile = match serde_json::from_slice(text) {
        Ok(f) => f,
        Err(e) => {
            out.dropped
                .push(format!("the file is not a record ({e}); starting empty"));
            return out;
        }
    };
    if file.version != VERSION {
        out.dropped.push(format!(
            "the file is version {}, this daemon reads {VERSION}; starting empty",
            file.version
        ));
        return out;
    }
    for e in file.devices {
        match checked(&e) {
            Err(why) => out.dropped.push(why),
            Ok(_) if out.devices.contains_key(&e.device_id) => out
                .dropped
                .push(format!("entry {:?}: a duplicate", e.device_id)),
            Ok(_) if out.devices.len() >= MAX_ENTRIES => {
                out.dropped.push(format!(
                    "entry {:?} and the rest: more than {MAX_ENTRIES} entries",
                    e.device_id
                ));
                break;
            }
            Ok(i) => {
                out.devices.insert(e.device_id, (e.resource, i));
            }
        }
    }
    out
}

/// The entry's ifindex when it names a device of its resource and an
/// ifindex the kernel can give, else why not.
fn checked(e: &FileEntry) -> std::result::Result<u32, String> {
    if parse_device_id(&e.device_id).is_none_or(|(r, _)| r != e.resource) {
        return Err(format!(
            "entry {:?}: not a device ID of resource {:?}",
            e.device_id, e.resource
        ));
    }
    u32::try_from(e.ifindex)
        .ok()
        .filter(|i| *i >= 1 && *i <= i32::MAX as u32)
        .ok_or_else(|| {
            format!(
                "entry {:?}: ifindex {} is not one the kernel gives",
                e.device_id, e.ifindex
            )
        })
}

/// Applies the journal's `text` over `parsed`, line by line: a later line
/// for a device replaces what it had. A line that is not a valid entry (one
/// cut short by a kill, at the end) is dropped with the reason.
pub(crate) fn replay(parsed: &mut Parsed, text: &[u8]) {
    for (n, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let e: FileEntry = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => {
                parsed
                    .dropped
                    .push(format!("journal line {}: not an entry ({e})", n + 1));
                continue;
            }
        };
        match checked(&e) {
            Err(why) => parsed
                .dropped
                .push(format!("journal line {}: {why}", n + 1)),
            Ok(_)
                if !parsed.devices.contains_key(&e.device_id)
                    && parsed.devices.len() >= MAX_ENTRIES =>
            {
                parsed.dropped.push(format!(
                    "journal line {}: more than {MAX_ENTRIES} entries",
                    n + 1
                ));
            }
            Ok(i) => {
                parsed.devices.insert(e.device_id, (e.resource, i));
            }
        }
    }
}

/// The journal line of one entry. A failure to encode it is an error, never
/// an empty line.
pub(crate) fn journal_line(e: Entry<'_>) -> std::io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(&FileEntry {
        device_id: e.device_id.to_string(),
        resource: e.resource.to_string(),
        ifindex: u64::from(e.ifindex),
    })?;
    line.push(b'\n');
    Ok(line)
}

/// Appends `lines` to the journal beside the record at `record` in one
/// write, creating the directory (owner-only) and the journal (0600) when
/// missing.
pub(crate) fn append(record: &Path, lines: &[u8]) -> Result<()> {
    create_dir_of(record)?;
    let journal = journal_path(record);
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&journal)
        .and_then(|mut f| f.write_all(lines))
        .map_err(Error::io(
            "appending to the journal of handed-out devices",
            &journal,
        ))
}

/// The journal's size in bytes (0 when there is none).
pub(crate) fn journal_len(record: &Path) -> u64 {
    std::fs::metadata(journal_path(record)).map_or(0, |m| m.len())
}

/// Empties the journal beside the record at `record` (after its lines were
/// folded into the record).
pub(crate) fn clear_journal(record: &Path) -> Result<()> {
    let journal = journal_path(record);
    match std::fs::OpenOptions::new().write(true).open(&journal) {
        Ok(f) => f.set_len(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
    .map_err(Error::io(
        "emptying the journal of handed-out devices",
        &journal,
    ))
}

/// The record's text for `entries` (sorted by device ID, so equal records
/// are equal files). A failure to encode it is an error, never an empty
/// text that [`save`] would write over the record.
pub(crate) fn render<'a>(entries: impl IntoIterator<Item = Entry<'a>>) -> std::io::Result<Vec<u8>> {
    let mut devices: Vec<FileEntry> = entries
        .into_iter()
        .map(|e| FileEntry {
            device_id: e.device_id.to_string(),
            resource: e.resource.to_string(),
            ifindex: u64::from(e.ifindex),
        })
        .collect();
    devices.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    let mut text = serde_json::to_vec(&RecordFile {
        version: VERSION,
        devices,
    })?;
    text.push(b'\n');
    Ok(text)
}

/// Reads the record at `path` and the journal beside it: `Ok(None)` when
/// there is neither yet; a file too big or unreadable is an error.
pub(crate) fn load_all(path: &Path) -> Result<Option<Parsed>> {
    let base = load(path)?;
    let journal = read_bounded(&journal_path(path))?;
    Ok(match (base, journal) {
        (None, None) => None,
        (base, journal) => {
            let mut parsed = base.unwrap_or_default();
            if let Some(text) = journal {
                replay(&mut parsed, &text);
            }
            Some(parsed)
        }
    })
}

/// Reads the record at `path` (without its journal): `Ok(None)` when there
/// is none yet; a file too big or unreadable is an error.
pub(crate) fn load(path: &Path) -> Result<Option<Parsed>> {
    Ok(read_bounded(path)?.map(|text| parse(&text)))
}

/// The bytes of the file at `path`, `Ok(None)` when it is missing; over
/// [`MAX_BYTES`] or unreadable is an error.
fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::io("opening the record of handed-out devices", path)(
                e,
            ));
        }
    };
    let len = file
        .metadata()
        .map_err(Error::io("reading the record of handed-out devices", path))?
        .len();
    if len > MAX_BYTES {
        return Err(Error::io("reading the record of handed-out devices", path)(
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("it is {len} bytes, more than a record can be ({MAX_BYTES})"),
            ),
        ));
    }
    let mut text = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BYTES + 1), &mut text)
        .map_err(Error::io("reading the record of handed-out devices", path))?;
    Ok(Some(text))
}

/// Creates the directory of the record at `record` (owner-only) when it is
/// missing.
fn create_dir_of(record: &Path) -> Result<()> {
    let dir = record.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(Error::io(
            "creating the directory of the record of handed-out devices",
            dir,
        ))?;
    Ok(())
}

/// Replaces the record at `path` with `text`: a temporary file beside it
/// renamed over it, so a process killed at any point leaves the old record
/// or the new one ([`flush`] makes it durable). Creates the directory
/// (owner-only) when it is missing. An empty `text` is refused: a record,
/// even of no device, is never empty, so it can only be a text that failed
/// to render.
pub(crate) fn save(path: &Path, text: &[u8]) -> Result<()> {
    if text.is_empty() {
        return Err(Error::io("writing the record of handed-out devices", path)(
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "refusing to replace it with an empty text",
            ),
        ));
    }
    create_dir_of(path)?;
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io("writing the record of handed-out devices", &tmp)(
            e,
        ));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(
            "replacing the record of handed-out devices",
            path,
        )(e));
    }
    Ok(())
}

/// Flushes the record at `path`, its journal and their directory to disk
/// (`fsync`), so the last [`save`] and [`append`] survive a power loss too.
pub(crate) fn flush(path: &Path) -> Result<()> {
    for file in [path.to_path_buf(), journal_path(path)] {
        match std::fs::File::open(&file) {
            Ok(f) => f.sync_all(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
        .map_err(Error::io(
            "flushing the record of handed-out devices",
            &file,
        ))?;
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io(
            "flushing the directory of the record of handed-out devices",
            dir,
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_replays_over_the_record_last_line_first() {
        let mut parsed = parse(&render([entry("dpMvp0", "dp", 40)]).unwrap());
        let mut journal = journal_line(entry("dpMvp0", "dp", 50)).unwrap();
        journal.extend(journal_line(entry("dpMvp1", "dp", 41)).unwrap());
        journal.extend(journal_line(entry("otherMvp1", "dp", 42)).unwrap());
        journal.extend(journal_line(entry("dpMvp2", "dp", 0)).unwrap());
        journal.extend(b"{\"deviceID\":\"dpMvp3\"");
        replay(&mut parsed, &journal);
        assert_eq!(parsed.devices.get("dpMvp0"), Some(&("dp".into(), 50)));
        assert_eq!(parsed.devices.get("dpMvp1"), Some(&("dp".into(), 41)));
        assert_eq!(parsed.devices.len(), 2);
        assert_eq!(parsed.dropped.len(), 3, "{:?}", parsed.dropped);
        assert!(parsed.dropped[2].starts_with("journal line 5: not an entry"));
    }

    fn entry<'a>(device_id: &'a str, resource: &'a str, ifindex: u32) -> Entry<'a> {
        Entry {
            device_id,
            resource,
            ifindex,
        }
    }

    #[test]
    fn a_rendered_record_reads_back_the_same() {
        let text = render([entry("dpMvp2", "dp", 41), entry("dpMvp0", "dp", 40)]).unwrap();
        let parsed = parse(&text);
        assert_eq!(parsed.dropped, Vec::<String>::new());
        assert_eq!(
            parsed.devices.into_iter().collect::<Vec<_>>(),
            [
                ("dpMvp0".to_string(), ("dp".to_string(), 40)),
                ("dpMvp2".to_string(), ("dp".to_string(), 41)),
            ]
        );
        // Sorted: the same record is the same file.
        assert_eq!(
            text,
            render([entry("dpMvp0", "dp", 40), entry("dpMvp2", "dp", 41)]).unwrap()
        );
    }

    #[test]
    fn corrupt_text_gives_no_entries_and_says_why() {
        let good = render([entry("dpMvp0", "dp", 40)]).unwrap();
        for bad in [
            &b""[..],
            &good[..good.len() / 2],
            b"\0\0\0\0",
            br#"{"version":2,"devices":[{"deviceID":"dpMvp0","resource":"dp","ifindex":40}]}"#,
            br#"{"devices":[]}"#,
        ] {
            let parsed = parse(bad);
            assert!(
                parsed.devices.is_empty(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            assert_eq!(parsed.dropped.len(), 1, "{:?}", parsed.dropped);
        }
    }

    #[test]
    fn invalid_entries_are_dropped_and_the_valid_ones_kept() {
        let text = br#"{"version":1,"devices":[
            {"deviceID":"dpMvp0","resource":"dp","ifindex":40},
            {"deviceID":"dpMvp1","resource":"other","ifindex":41},
            {"deviceID":"../etc","resource":"dp","ifindex":42},
            {"deviceID":"dpMvp3","resource":"dp","ifindex":0},
            {"deviceID":"dpMvp4","resource":"dp","ifindex":4294967296},
            {"deviceID":"dpMvp5","resource":"dp","ifindex":2147483648},
            {"deviceID":"dpMvp0","resource":"dp","ifindex":50}
        ]}"#;
        let parsed = parse(text);
        assert_eq!(
            parsed.devices.into_iter().collect::<Vec<_>>(),
            [("dpMvp0".to_string(), ("dp".to_string(), 40))]
        );
        assert_eq!(parsed.dropped.len(), 6, "{:?}", parsed.dropped);
        assert!(
            parsed.dropped[5].contains("duplicate"),
            "{:?}",
            parsed.dropped
        );
    }

    #[test]
    fn at_most_max_entries_are_kept() {
        let ids: Vec<String> = (0..MAX_ENTRIES + 2).map(|i| format!("dpMvp{i}")).collect();
        let text = render(ids.iter().map(|id| entry(id, "dp", 7))).unwrap();
        let parsed = parse(&text);
        assert_eq!(parsed.devices.len(), MAX_ENTRIES);
        assert_eq!(parsed.dropped.len(), 1, "{:?}", parsed.dropped);
    }

    #[test]
    fn save_replaces_the_record_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert_eq!(load(&path).unwrap(), None, "no record yet");
        save(&path, &render([entry("dpMvp0", "dp", 40)]).unwrap()).unwrap();
        save(&path, &render([entry("dpMvp1", "dp", 41)]).unwrap()).unwrap();
        let parsed = load(&path).unwrap().unwrap();
        assert_eq!(
            parsed.devices.keys().collect::<Vec<_>>(),
            ["dpMvp1"],
            "the second record replaced the first"
        );
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [FILE_NAME]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn save_never_replaces_the_record_with_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        save(&path, &render([entry("dpMvp0", "dp", 40)]).unwrap()).unwrap();
        assert!(save(&path, b"").is_err(), "an empty record was written");
        let parsed = load(&path).unwrap().unwrap();
        assert_eq!(parsed.devices.keys().collect::<Vec<_>>(), ["dpMvp0"]);
    }

    #[test]
    fn a_record_too_big_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.to_string().contains("more than a record can be"), "{e}");
    }
}
