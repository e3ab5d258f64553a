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
//!
//! The device-plugins directory is shared: every device plugin of the node
//! mounts it, often as root, so any of them can put a file, a link or a
//! FIFO where the record's files go. The daemon trusts nothing there but
//! its own directory, and that only once checked: it is opened once
//! without following a link (`O_DIRECTORY|O_NOFOLLOW`, `RecordDir`) and
//! must be a directory of the daemon's uid with mode 0700 (made so when
//! missing, at the first write; a looser mode set back through the
//! descriptor); a link, anything else, or another user's directory is
//! refused, never followed. Every file in it is looked at with `fstatat`
//! (nothing opened, nothing followed), then opened through the directory's
//! descriptor with `O_NOFOLLOW|O_NONBLOCK`, checked again on the opened
//! descriptor, and sized, truncated and flushed through descriptors only;
//! it must be a regular file of the daemon's with one name. Whatever else is
//! at a name the record uses (a link, a FIFO, a socket, a device node, a
//! directory, a hard link to a file elsewhere) was planted: it is removed
//! (`unlinkat`, a directory level by level without following a link) and
//! reported once, as a warning and through `Observer::planted_removed`
//! (an Event on the Node), and the daemon writes its own file; an
//! Allocate's append that meets one still records its devices. A
//! temporary record has a fresh name nobody can guess, created `O_EXCL`.
//! Left open: a root process that swaps a file between the daemon's look
//! and its open may get a device node opened (and refused unwritten), and
//! one that renames the whole directory away takes the record with it (a
//! later daemon heals nothing handed out before; nothing else is touched).

use crate::core::report::{Observer, Planted};
use crate::error::{Error, Result};
use macvtap_link::device::parse_device_id;
use nix::NixPath;
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, geteuid, unlinkat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::{info, warn};

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
/// The start of a temporary record's name; 16 hex digits follow.
pub(crate) const TMP_PREFIX: &str = "assignments.json.tmp.";
/// The record directory's mode: the daemon's alone.
pub(crate) const DIR_MODE: u32 = 0o700;
/// The mode of the record's files.
const FILE_MODE: u32 = 0o600;

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

/// The record directory under the device-plugins directory `plugin_dir`.
pub(crate) fn dir_in(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join(STATE_DIR)
}

/// The record directory, opened once without following a link and checked
/// to be the daemon's own: a directory of its uid, mode 0700. Every file of
/// the record is opened, sized, truncated, renamed and removed through this
/// descriptor, so nothing planted on the way to it (the device-plugins
/// directory is shared with every device plugin of the node) can redirect a
/// write.
#[derive(Debug)]
pub(crate) struct RecordDir {
    fd: File,
    path: PathBuf,
}

impl RecordDir {
    /// Opens the record directory under `plugin_dir`; `Ok(None)` when it
    /// does not exist. A symbolic link, anything but a directory, or a
    /// directory of another user is refused (and never followed); a
    /// directory of the daemon's with another mode than 0700 gets 0700
    /// through the opened descriptor, with a warning.
    pub(crate) fn open(plugin_dir: &Path) -> Result<Option<Self>> {
        Self::open_in(plugin_dir, false)
    }

    /// Opens the record directory under `plugin_dir` as [`RecordDir::open`]
    /// does, making it (0700) first when it is missing.
    pub(crate) fn open_or_create(plugin_dir: &Path) -> Result<Self> {
        Self::open_in(plugin_dir, true)?.ok_or_else(|| {
            Error::io("opening the record directory", dir_in(plugin_dir))(
                std::io::ErrorKind::NotFound.into(),
            )
        })
    }

    fn open_in(plugin_dir: &Path, create: bool) -> Result<Option<Self>> {
        let path = dir_in(plugin_dir);
        let op = "opening the record directory";
        // The device-plugins directory is the administrator's mount: its
        // path is followed, our directory in it never.
        let parent = nix::fcntl::open(
            plugin_dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io("opening the device-plugins directory", plugin_dir)(e.into()))?;
        // O_DIRECTORY: a FIFO or a device node there is never opened.
        let flags = OFlag::O_RDONLY
            | OFlag::O_DIRECTORY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        let opened = match openat(&parent, STATE_DIR, flags, Mode::empty()) {
            Err(Errno::ENOENT) if !create => return Ok(None),
            Err(Errno::ENOENT) => {
                match mkdirat(&parent, STATE_DIR, Mode::from_bits_truncate(DIR_MODE)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => {
                        return Err(Error::io("creating the record directory", &path)(e.into()));
                    }
                }
                openat(&parent, STATE_DIR, flags, Mode::empty())
            }
            other => other,
        };
        let euid = geteuid().as_raw();
        let fd = match opened {
            Ok(fd) => File::from(fd),
            Err(e @ (Errno::ENOTDIR | Errno::ELOOP)) => {
                let Ok(st) = fstatat(&parent, STATE_DIR, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                    return Err(Error::io(op, &path)(e.into()));
                };
                let st = Stat::from(&st);
                let found = describe(&parent, STATE_DIR, st);
                return Err(match judge_dir(st, &found, euid) {
                    DirState::Refused(why) => Error::RecordDir { path, why },
                    // A directory now: replaced since the open.
                    DirState::Ours | DirState::Mode(_) => Error::io(op, &path)(e.into()),
                });
            }
            Err(e) => return Err(Error::io(op, &path)(e.into())),
        };
        let st = Stat::from(&fd.metadata().map_err(Error::io(op, &path))?);
        match judge_dir(st, kind(st), euid) {
            DirState::Ours => {}
            DirState::Mode(mode) => {
                fchmod(&fd, Mode::from_bits_truncate(DIR_MODE)).map_err(|e| {
                    Error::io("setting the mode of the record directory", &path)(e.into())
                })?;
                warn!(dir = %path.display(), mode = %format!("{mode:04o}"),
                    "the record directory was open to others; set its mode back to 0700");
            }
            DirState::Refused(why) => return Err(Error::RecordDir { path, why }),
        }
        Ok(Some(Self { fd, path }))
    }
}

/// The record directory as `stat` saw it (without following it), judged
/// for a daemon of uid `euid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DirState {
    /// A directory of the daemon's, mode 0700.
    Ours,
    /// A directory of the daemon's with this other mode (the daemon sets
    /// 0700 through its descriptor).
    Mode(u32),
    /// Not to be used, and why: the end of a sentence that begins with the
    /// directory's path (`is a symbolic link to "/x"; refusing to follow
    /// it ...`).
    Refused(String),
}

/// Judges the record directory by its `stat` (`found` says what it is, as
/// [`kind`] or with a link's target) for a daemon of uid `euid`: only a
/// directory of `euid` is used, and only with mode 0700.
pub(crate) fn judge_dir(st: Stat, found: &str, euid: u32) -> DirState {
    const FIX: &str = "remove it, and the daemon makes its own directory there";
    let format = st.mode & SFlag::S_IFMT.bits();
    if format == SFlag::S_IFLNK.bits() {
        return DirState::Refused(format!(
            "is {found}; refusing to follow it (something else on the node planted it): {FIX}"
        ));
    }
    if format != SFlag::S_IFDIR.bits() {
        return DirState::Refused(format!(
            "is {found}, not a directory; refusing to use it (something else on the node planted \
             it): {FIX}"
        ));
    }
    if st.uid != euid {
        return DirState::Refused(format!(
            "is a directory of uid {}, not of the daemon's uid {euid}; refusing to use it \
             (something else on the node made it): {FIX}",
            st.uid
        ));
    }
    match st.mode & 0o7777 {
        DIR_MODE => DirState::Ours,
        mode => DirState::Mode(mode),
    }
}

/// What `stat` says of an inode, the part the record's checks read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// `st_mode`: the type and permission bits.
    pub mode: u32,
    /// The owner.
    pub uid: u32,
    /// How many names it has.
    pub nlink: u64,
}

impl From<&FileStat> for Stat {
    // `nlink_t` is 64 bits here and 32 on other targets (aarch64).
    #[allow(clippy::useless_conversion)]
    fn from(st: &FileStat) -> Self {
        Self {
            mode: st.st_mode,
            uid: st.st_uid,
            nlink: u64::from(st.st_nlink),
        }
    }
}

impl From<&std::fs::Metadata> for Stat {
    fn from(m: &std::fs::Metadata) -> Self {
        Self {
            mode: m.mode(),
            uid: m.uid(),
            nlink: m.nlink(),
        }
    }
}

/// What an inode is, as a phrase: `a FIFO`, `a directory`, `a regular file`.
pub(crate) fn kind(st: Stat) -> &'static str {
    match SFlag::from_bits_truncate(st.mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        _ => "a file of unknown type",
    }
}

/// Why an inode is not a file the daemon made, as a phrase (`a FIFO`, `a
/// regular file with 2 links`), or `None` when it is one: a regular file of
/// `euid` with one name. A second name could be another program's file
/// hard-linked here, which a write or a truncation would change.
pub(crate) fn foreign(st: Stat, euid: u32) -> Option<String> {
    if st.mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
        return Some(kind(st).to_string());
    }
    if st.uid != euid {
        return Some(format!("a regular file of uid {}", st.uid));
    }
    if st.nlink != 1 {
        return Some(format!(
            "a regular file with {} links (a hard link to a file elsewhere)",
            st.nlink
        ));
    }
    None
}

/// Whether the inode is a symbolic link.
pub(crate) fn is_link(st: Stat) -> bool {
    st.mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits()
}

/// A link's target as a phrase: `a symbolic link to "/host/cni-bin/multus-shim"`,
/// quoted and escaped (the target is whatever the planter wrote).
pub(crate) fn link_to(target: &std::ffi::OsStr) -> String {
    format!("a symbolic link to {target:?}")
}

/// `name` in `dir` as a phrase: [`kind`], and a symbolic link's target.
fn describe(dir: &impl AsFd, name: &str, st: Stat) -> String {
    match readlinkat(dir, name) {
        Ok(target) if is_link(st) => link_to(&target),
        _ => kind(st).to_string(),
    }
}

/// How deep a directory planted where a file belongs may be for it to be
/// removed; a deeper one is an error (and stays).
const MAX_PLANTED_DEPTH: u32 = 8;
/// How many times a file is looked at and opened while something keeps
/// replacing it.
const OPEN_TRIES: usize = 4;

/// What is at a name in the record directory.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// Nothing.
    Nothing,
    /// A file the daemon made (see [`foreign`]).
    Ours,
    /// Something else, as a phrase.
    Planted(String),
}

/// What is at `name` in `dir`, looked at with `fstatat`: never following a
/// link, never opening anything.
fn look(dir: &RecordDir, name: &str) -> nix::Result<Found> {
    let st = match fstatat(&dir.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Stat::from(&st),
        Err(Errno::ENOENT) => return Ok(Found::Nothing),
        Err(e) => return Err(e),
    };
    Ok(match foreign(st, geteuid().as_raw()) {
        None => Found::Ours,
        Some(_) if is_link(st) => Found::Planted(describe(&dir.fd, name, st)),
        Some(what) => Found::Planted(what),
    })
}

/// Removes `name` from `dir` (never following it; a directory with what it
/// holds), which is `what`, and reports it once: a warning naming it, and
/// [`Observer::planted_removed`] (an Event on the Node, in the daemon).
fn remove_planted(dir: &RecordDir, name: &str, what: String, report: &dyn Observer) -> Result<()> {
    let path = dir.path.join(name);
    let removed = match unlinkat(&dir.fd, name, UnlinkatFlags::NoRemoveDir) {
        Err(Errno::EISDIR) => remove_tree(&dir.fd, name, MAX_PLANTED_DEPTH),
        other => other,
    };
    match removed {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => {
            return Err(Error::io(
                "removing what something else put in the record directory",
                &path,
            )(e.into()));
        }
    }
    warn!(path = %path.display(), found = %what,
        "removed what something else on the node put where the record of handed-out devices keeps a file (a pod with the device-plugins directory mounted); the daemon writes its own file there");
    report.planted_removed(&Planted { path, what });
    Ok(())
}

/// Removes directory `name` in `parent` and everything in it, `depth`
/// levels deep at most, following no link: each level is opened
/// `O_NOFOLLOW` and its entries are unlinked through that descriptor. (A
/// directory planted where a file belongs would otherwise keep the record
/// from being written until someone removed it by hand.)
fn remove_tree<P: ?Sized + NixPath>(parent: &impl AsFd, name: &P, depth: u32) -> nix::Result<()> {
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY
            | OFlag::O_DIRECTORY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut dir = Dir::from_fd(fd)?;
    let names: Vec<CString> = dir
        .iter()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for n in &names {
        match unlinkat(&dir, n.as_c_str(), UnlinkatFlags::NoRemoveDir) {
            Err(Errno::EISDIR) if depth > 0 => remove_tree(&dir, n.as_c_str(), depth - 1)?,
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    drop(dir);
    unlinkat(parent, name, UnlinkatFlags::RemoveDir)
}

/// Removes what is at `name` in `dir` when it was not made by the daemon,
/// reporting it; true when something was removed.
fn clear_planted(dir: &RecordDir, name: &str, report: &dyn Observer) -> Result<bool> {
    match look(dir, name) {
        Ok(Found::Planted(what)) => remove_planted(dir, name, what, report).map(|()| true),
        Ok(Found::Nothing | Found::Ours) => Ok(false),
        Err(e) => Err(Error::io(
            "looking at a file of the record of handed-out devices",
            dir.path.join(name),
        )(e.into())),
    }
}

/// Opens `name` in `dir` with `flags` (and always `O_NOFOLLOW`,
/// `O_NONBLOCK`, `O_CLOEXEC`) as a file the daemon made: a regular file of
/// its uid with one name, checked again on the opened descriptor. What
/// else is there is removed and reported first, and never opened: opening a
/// device node can act (a watchdog's starts it), and a FIFO would block.
/// `Ok(None)` when there is no such file and `flags` do not create one.
fn open_file(
    dir: &RecordDir,
    name: &str,
    flags: OFlag,
    report: &dyn Observer,
) -> Result<Option<File>> {
    let path = dir.path.join(name);
    let op = "opening a file of the record of handed-out devices";
    let create = flags.contains(OFlag::O_CREAT);
    let all = flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    for _ in 0..OPEN_TRIES {
        if clear_planted(dir, name, report)? && !create {
            return Ok(None);
        }
        match openat(&dir.fd, name, all, Mode::from_bits_truncate(FILE_MODE)) {
            Ok(fd) => {
                let file = File::from(fd);
                let st = file.metadata().map_err(Error::io(op, &path))?;
                if foreign(Stat::from(&st), geteuid().as_raw()).is_none() {
                    return Ok(Some(file));
                }
                // Replaced between the look and the open: look again.
            }
            Err(Errno::ENOENT) if !create => return Ok(None),
            // Replaced by a link, a socket, a FIFO or a directory between
            // the look and the open: look again.
            Err(Errno::ELOOP | Errno::ENXIO | Errno::EISDIR | Errno::ENOENT) => {}
            Err(e) => return Err(Error::io(op, &path)(e.into())),
        }
    }
    Err(Error::io(op, &path)(std::io::Error::other(
        "something keeps replacing it with a file the daemon did not make",
    )))
}

/// Appends `lines` to the journal in `dir` in one write, creating it (0600)
/// when missing; what else is at its name is removed and reported first.
pub(crate) fn append(dir: &RecordDir, lines: &[u8], report: &dyn Observer) -> Result<()> {
    let path = dir.path.join(JOURNAL_NAME);
    let op = "appending to the journal of handed-out devices";
    let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT;
    match open_file(dir, JOURNAL_NAME, flags, report)? {
        Some(mut f) => f.write_all(lines).map_err(Error::io(op, &path)),
        None => Err(Error::io(op, &path)(std::io::ErrorKind::NotFound.into())),
    }
}

/// The journal's size in bytes: 0 when there is none, or when what is at
/// its name was not made by the daemon. Read with `fstatat`, which neither
/// follows a link nor opens anything, so it can neither block nor size a
/// file elsewhere.
pub(crate) fn journal_len(dir: &RecordDir) -> u64 {
    match fstatat(&dir.fd, JOURNAL_NAME, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if foreign(Stat::from(&st), geteuid().as_raw()).is_none() => {
            u64::try_from(st.st_size).unwrap_or(0)
        }
        _ => 0,
    }
}

/// Empties the journal in `dir` (after its lines were folded into the
/// record) through the opened file (`ftruncate`); what else is at its name
/// is removed and reported instead.
pub(crate) fn clear_journal(dir: &RecordDir, report: &dyn Observer) -> Result<()> {
    match open_file(dir, JOURNAL_NAME, OFlag::O_WRONLY, report)? {
        Some(f) => f.set_len(0).map_err(Error::io(
            "emptying the journal of handed-out devices",
            dir.path.join(JOURNAL_NAME),
        )),
        None => Ok(()),
    }
}

/// Reads the record in `dir` and the journal beside it: `Ok(None)` when
/// there is neither yet; a file too big or unreadable is an error. What is
/// at their names and was not made by the daemon, and the temporary
/// records a stopped compaction left, are removed first (the former
/// reported).
pub(crate) fn load_all(dir: &RecordDir, report: &dyn Observer) -> Result<Option<Parsed>> {
    sweep_temporaries(dir, report)?;
    let base = load(dir, report)?;
    let journal = read_bounded(dir, JOURNAL_NAME, report)?;
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

/// Reads the record in `dir` (without its journal): `Ok(None)` when there
/// is none yet; a file too big or unreadable is an error.
pub(crate) fn load(dir: &RecordDir, report: &dyn Observer) -> Result<Option<Parsed>> {
    Ok(read_bounded(dir, FILE_NAME, report)?.map(|text| parse(&text)))
}

/// The bytes of file `name` in `dir`, `Ok(None)` when it is missing (or
/// was not made by the daemon, and was removed); over [`MAX_BYTES`] or
/// unreadable is an error.
fn read_bounded(dir: &RecordDir, name: &str, report: &dyn Observer) -> Result<Option<Vec<u8>>> {
    let path = dir.path.join(name);
    let op = "reading the record of handed-out devices";
    let Some(file) = open_file(dir, name, OFlag::O_RDONLY, report)? else {
        return Ok(None);
    };
    let len = file.metadata().map_err(Error::io(op, &path))?.len();
    if len > MAX_BYTES {
        return Err(Error::io(op, &path)(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is {len} bytes, more than a record can be ({MAX_BYTES})"),
        )));
    }
    let mut text = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BYTES + 1), &mut text)
        .map_err(Error::io(op, &path))?;
    Ok(Some(text))
}

/// A fresh name for a temporary record: [`TMP_PREFIX`] and 16 hex digits
/// nobody can guess (std's `RandomState` is keyed from the kernel's random
/// numbers), so nobody can plant a file at it in advance.
fn temporary_name() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{TMP_PREFIX}{:016x}", h.finish())
}

/// Removes every temporary record in `dir` (`assignments.json.tmp.*`,
/// which only [`save`] makes, with the record's lock held): a file the
/// daemon made is what a stopped compaction left, removed with a note;
/// anything else was planted there, and is reported.
fn sweep_temporaries(dir: &RecordDir, report: &dyn Observer) -> Result<()> {
    let names: Vec<String> = Dir::openat(
        &dir.fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(|d| {
        d.into_iter()
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
            .filter(|n| n.starts_with(TMP_PREFIX))
            .collect()
    })
    .map_err(|e| Error::io("listing the record directory", &dir.path)(e.into()))?;
    for name in names {
        let path = dir.path.join(&name);
        match look(dir, &name) {
            Ok(Found::Ours) => match unlinkat(&dir.fd, name.as_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) => {
                    info!(path = %path.display(), "removed a temporary record a stopped compaction left")
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(Error::io("removing a temporary record", &path)(e.into())),
            },
            Ok(Found::Planted(what)) => remove_planted(dir, &name, what, report)?,
            Ok(Found::Nothing) => {}
            Err(e) => return Err(Error::io("looking at a temporary record", &path)(e.into())),
        }
    }
    Ok(())
}

/// Replaces the record in `dir` with `text`: a new temporary file
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`, a name nobody can guess) renamed over it
/// within the directory, so a process killed at any point leaves the old
/// record or the new one ([`flush`] makes it durable). What is at the
/// record's name and was not made by the daemon, and stale temporary
/// records, are removed first (a rename would replace a planted link
/// without following it, but silently, and not a directory). An empty
/// `text` is refused: a record, even of no device, is never empty, so it
/// can only be a text that failed to render.
pub(crate) fn save(dir: &RecordDir, text: &[u8], report: &dyn Observer) -> Result<()> {
    let path = dir.path.join(FILE_NAME);
    let op = "writing the record of handed-out devices";
    if text.is_empty() {
        return Err(Error::io(op, &path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "refusing to replace it with an empty text",
        )));
    }
    sweep_temporaries(dir, report)?;
    let flags = OFlag::O_WRONLY
        | OFlag::O_CREAT
        | OFlag::O_EXCL
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_CLOEXEC;
    let mut created = None;
    for _ in 0..OPEN_TRIES {
        let name = temporary_name();
        match openat(
            &dir.fd,
            name.as_str(),
            flags,
            Mode::from_bits_truncate(FILE_MODE),
        ) {
            Ok(fd) => {
                created = Some((name, File::from(fd)));
                break;
            }
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(Error::io(op, dir.path.join(name))(e.into())),
        }
    }
    let Some((tmp, mut file)) = created else {
        return Err(Error::io(op, &path)(std::io::Error::other(
            "every fresh temporary name was taken",
        )));
    };
    let replaced = file
        .write_all(text)
        .map_err(Error::io(op, dir.path.join(&tmp)))
        .and_then(|()| clear_planted(dir, FILE_NAME, report))
        .and_then(|_| {
            renameat(&dir.fd, tmp.as_str(), &dir.fd, FILE_NAME).map_err(|e| {
                Error::io("replacing the record of handed-out devices", &path)(e.into())
            })
        });
    if replaced.is_err() {
        let _ = unlinkat(&dir.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    replaced
}

/// Flushes the record and its journal in `dir`, and the directory itself,
/// to disk (`fsync` of descriptors opened through the directory's), so the
/// last [`save`] and [`append`] survive a power loss too. What is at their
/// names and was not made by the daemon is skipped (the next write removes
/// it).
pub(crate) fn flush(dir: &RecordDir) -> Result<()> {
    let op = "flushing the record of handed-out devices";
    for name in [FILE_NAME, JOURNAL_NAME] {
        let path = dir.path.join(name);
        match look(dir, name) {
            Ok(Found::Ours) => {}
            Ok(Found::Nothing | Found::Planted(_)) => continue,
            Err(e) => return Err(Error::io(op, &path)(e.into())),
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        match openat(&dir.fd, name, flags, Mode::empty()) {
            Ok(fd) => {
                let file = File::from(fd);
                let st = file.metadata().map_err(Error::io(op, &path))?;
                if foreign(Stat::from(&st), geteuid().as_raw()).is_none() {
                    file.sync_all().map_err(Error::io(op, &path))?;
                }
            }
            // Gone or replaced since the look: the next write sees to it.
            Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO) => {}
            Err(e) => return Err(Error::io(op, &path)(e.into())),
        }
    }
    dir.fd.sync_all().map_err(Error::io(
        "flushing the directory of the record of handed-out devices",
        &dir.path,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::report::{Recorder, Silent};

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
        let tmp = tempfile::tempdir().unwrap();
        assert!(
            RecordDir::open(tmp.path()).unwrap().is_none(),
            "no record yet"
        );
        let dir = RecordDir::open_or_create(tmp.path()).unwrap();
        assert_eq!(load(&dir, &Silent).unwrap(), None, "no record yet");
        save(&dir, &render([entry("dpMvp0", "dp", 40)]).unwrap(), &Silent).unwrap();
        save(&dir, &render([entry("dpMvp1", "dp", 41)]).unwrap(), &Silent).unwrap();
        let parsed = load(&dir, &Silent).unwrap().unwrap();
        assert_eq!(
            parsed.devices.keys().collect::<Vec<_>>(),
            ["dpMvp1"],
            "the second record replaced the first"
        );
        assert_eq!(names(&dir_in(tmp.path())), [FILE_NAME]);
        assert_eq!(mode(&dir_in(tmp.path())), 0o700);
        assert_eq!(mode(&path_in(tmp.path())), 0o600);
    }

    #[test]
    fn save_never_replaces_the_record_with_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RecordDir::open_or_create(tmp.path()).unwrap();
        save(&dir, &render([entry("dpMvp0", "dp", 40)]).unwrap(), &Silent).unwrap();
        assert!(
            save(&dir, b"", &Silent).is_err(),
            "an empty record was written"
        );
        let parsed = load(&dir, &Silent).unwrap().unwrap();
        assert_eq!(parsed.devices.keys().collect::<Vec<_>>(), ["dpMvp0"]);
    }

    #[test]
    fn a_record_too_big_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RecordDir::open_or_create(tmp.path()).unwrap();
        let f = std::fs::File::create(path_in(tmp.path())).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        let e = load(&dir, &Silent).unwrap_err();
        assert!(e.to_string().contains("more than a record can be"), "{e}");
    }

    /// The file names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// The permission bits of `path` (not following a link).
    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    /// What a planted file can be.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Plant {
        /// A symbolic link to a file of another program's, elsewhere.
        LinkToFile,
        /// A symbolic link to a FIFO elsewhere.
        LinkToFifo,
        /// A symbolic link to nothing (yet) elsewhere.
        Dangling,
        /// A FIFO.
        Fifo,
        /// A socket.
        Socket,
        /// A hard link to a file of another program's.
        HardLink,
        /// A directory holding a file, a directory and a link to a
        /// directory elsewhere.
        Dir,
    }

    const EVERY_PLANT: [Plant; 7] = [
        Plant::LinkToFile,
        Plant::LinkToFifo,
        Plant::Dangling,
        Plant::Fifo,
        Plant::Socket,
        Plant::HardLink,
        Plant::Dir,
    ];

    /// The bytes of the file elsewhere that a followed link would write.
    const SHIM: &[u8] = b"\x7fELF the multus shim";

    /// A node's device-plugins directory beside another program's
    /// directory (`cni-bin`, with a file and a FIFO), as a planter would
    /// aim at.
    struct Node {
        _tmp: tempfile::TempDir,
        plugin: PathBuf,
        elsewhere: PathBuf,
    }

    impl Node {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let plugin = tmp.path().join("device-plugins");
            let elsewhere = tmp.path().join("cni-bin");
            std::fs::create_dir(&plugin).unwrap();
            std::fs::create_dir(&elsewhere).unwrap();
            std::fs::write(elsewhere.join("multus-shim"), SHIM).unwrap();
            nix::unistd::mkfifo(&elsewhere.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
            Self {
                _tmp: tmp,
                plugin,
                elsewhere,
            }
        }

        /// `name` in the record directory.
        fn at(&self, name: &str) -> PathBuf {
            dir_in(&self.plugin).join(name)
        }

        /// Puts `plant` at `path`.
        fn plant(&self, path: &Path, plant: Plant) {
            use std::os::unix::fs::symlink;
            match plant {
                Plant::LinkToFile => symlink(self.elsewhere.join("multus-shim"), path).unwrap(),
                Plant::LinkToFifo => symlink(self.elsewhere.join("fifo"), path).unwrap(),
                Plant::Dangling => symlink(self.elsewhere.join("not-yet"), path).unwrap(),
                Plant::Fifo => nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o600)).unwrap(),
                Plant::Socket => drop(std::os::unix::net::UnixListener::bind(path).unwrap()),
                Plant::HardLink => {
                    std::fs::hard_link(self.elsewhere.join("multus-shim"), path).unwrap()
                }
                Plant::Dir => {
                    std::fs::create_dir_all(path.join("sub/deeper")).unwrap();
                    std::fs::write(path.join("sub/file"), "x").unwrap();
                    symlink(&self.elsewhere, path.join("sub/deeper/out")).unwrap();
                }
            }
        }

        /// Asserts that nothing elsewhere was written, truncated, created,
        /// removed or chmodded.
        fn untouched_elsewhere(&self, after: &str) {
            assert_eq!(
                names(&self.elsewhere),
                ["fifo", "multus-shim"],
                "after {after}"
            );
            let shim = self.elsewhere.join("multus-shim");
            assert_eq!(std::fs::read(&shim).unwrap(), SHIM, "after {after}");
            assert_eq!(mode(&shim), 0o644, "after {after}");
            assert_eq!(mode(&self.elsewhere), 0o755, "after {after}");
        }
    }

    /// What `f` returns, failing the test when it takes more than a few
    /// seconds (an open that blocks on a FIFO) instead of hanging it.
    fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{what} did not return within 10 s (blocked on a FIFO?)"))
    }

    /// Runs `op` on the record directory of `node` with `plant` at each of
    /// `names` (and a `Recorder`), off this thread so that a block fails
    /// the test; gives its result, what was reported and what was logged.
    fn after_planting<T: Send + 'static>(
        node: &Node,
        names: &[&str],
        plant: Plant,
        op: impl FnOnce(&RecordDir, &Recorder) -> T + Send + 'static,
    ) -> (T, Vec<String>, String) {
        let dir = RecordDir::open_or_create(&node.plugin).unwrap();
        for name in names {
            node.plant(&node.at(name), plant);
        }
        let report = std::sync::Arc::new(Recorder::default());
        let told = report.clone();
        let (out, log) = returns(&format!("{plant:?}"), move || {
            let (guard, log) = crate::testlog::capture();
            let out = op(&dir, &told);
            drop(guard);
            (out, log.text())
        });
        (out, report.lines(), log)
    }

    /// Asserts that `path` was reported once, as `plant`, to the observer
    /// and in the log.
    fn reported_once(said: &[String], log: &str, path: &Path, plant: Plant) {
        let of_path: Vec<&String> = said
            .iter()
            .filter(|l| l.starts_with(&format!("planted {} ", path.display())))
            .collect();
        assert_eq!(
            of_path.len(),
            1,
            "{plant:?} at {}: {said:?}",
            path.display()
        );
        let what = match plant {
            Plant::LinkToFile => "a symbolic link to \"",
            Plant::LinkToFifo => "a symbolic link to \"",
            Plant::Dangling => "a symbolic link to \"",
            Plant::Fifo => "a FIFO",
            Plant::Socket => "a socket",
            Plant::HardLink => "a regular file with ",
            Plant::Dir => "a directory",
        };
        assert!(of_path[0].contains(what), "{plant:?}: {}", of_path[0]);
        assert_eq!(
            log.matches(&format!("path={} ", path.display())).count(),
            1,
            "{plant:?}: one warning naming the path: {log}"
        );
        assert!(log.contains("WARN"), "{log}");
    }

    #[test]
    fn an_append_removes_what_was_planted_at_the_journal_and_writes_only_its_own() {
        for plant in EVERY_PLANT {
            let node = Node::new();
            let line = journal_line(entry("dpMvp0", "dp", 40)).unwrap();
            let lines = line.clone();
            let (out, said, log) = after_planting(&node, &[JOURNAL_NAME], plant, move |d, r| {
                append(d, &lines, r)
            });
            out.unwrap();
            node.untouched_elsewhere(&format!("an append over {plant:?}"));
            let shim = std::fs::metadata(node.elsewhere.join("multus-shim")).unwrap();
            assert_eq!(shim.nlink(), 1, "the planted hard link stayed");
            reported_once(&said, &log, &node.at(JOURNAL_NAME), plant);
            let journal = node.at(JOURNAL_NAME);
            assert_eq!(std::fs::read(&journal).unwrap(), line, "{plant:?}");
            assert_eq!(mode(&journal), 0o600);
            // The next append finds its own journal: nothing more reported.
            let dir = RecordDir::open(&node.plugin).unwrap().unwrap();
            let r = Recorder::default();
            append(&dir, &line, &r).unwrap();
            assert_eq!(r.lines(), Vec::<String>::new());
        }
    }

    #[test]
    fn the_journal_size_never_follows_or_opens_what_was_planted() {
        for plant in EVERY_PLANT {
            let node = Node::new();
            let (len, said, _) =
                after_planting(&node, &[JOURNAL_NAME], plant, |d, _| journal_len(d));
            assert_eq!(len, 0, "{plant:?}: sized something else");
            assert_eq!(said, Vec::<String>::new(), "sizing removes nothing");
            node.untouched_elsewhere(&format!("sizing {plant:?}"));
        }
    }

    #[test]
    fn clearing_the_journal_removes_what_was_planted_and_truncates_nothing_elsewhere() {
        for plant in EVERY_PLANT {
            let node = Node::new();
            let (out, said, log) =
                after_planting(&node, &[JOURNAL_NAME], plant, |d, r| clear_journal(d, r));
            out.unwrap();
            node.untouched_elsewhere(&format!("clearing {plant:?}"));
            reported_once(&said, &log, &node.at(JOURNAL_NAME), plant);
            assert_eq!(names(&dir_in(&node.plugin)), Vec::<String>::new());
        }
    }

    #[test]
    fn a_save_removes_what_was_planted_at_the_record_and_at_temporary_names() {
        // The name the daemon used to write to (`.tmp.<pid>`, pid 1 in
        // its container) and one of the new pattern.
        let stale = [
            format!("{TMP_PREFIX}1"),
            format!("{TMP_PREFIX}00000000deadbeef"),
        ];
        for plant in EVERY_PLANT {
            let node = Node::new();
            let text = render([entry("dpMvp0", "dp", 40)]).unwrap();
            let names_planted = [FILE_NAME, stale[0].as_str(), stale[1].as_str()];
            let saved = text.clone();
            let (out, said, log) =
                after_planting(&node, &names_planted, plant, move |d, r| save(d, &saved, r));
            out.unwrap();
            node.untouched_elsewhere(&format!("a save over {plant:?}"));
            for name in names_planted {
                reported_once(&said, &log, &node.at(name), plant);
            }
            assert_eq!(said.len(), 3, "{said:?}");
            assert_eq!(names(&dir_in(&node.plugin)), [FILE_NAME], "{plant:?}");
            assert_eq!(std::fs::read(node.at(FILE_NAME)).unwrap(), text);
        }
    }

    #[test]
    fn a_temporary_record_gets_a_fresh_name_nobody_can_guess() {
        let (a, b) = (temporary_name(), temporary_name());
        assert_ne!(a, b);
        for name in [&a, &b] {
            let hex = name.strip_prefix(TMP_PREFIX).unwrap();
            assert_eq!(hex.len(), 16, "{name}");
            assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()), "{name}");
            assert_ne!(hex, format!("{:016x}", std::process::id()));
        }
    }

    #[test]
    fn a_stale_temporary_record_of_the_daemons_own_is_removed_quietly() {
        let node = Node::new();
        let dir = RecordDir::open_or_create(&node.plugin).unwrap();
        std::fs::write(node.at(&format!("{TMP_PREFIX}0123456789abcdef")), "{").unwrap();
        let r = Recorder::default();
        assert_eq!(load_all(&dir, &r).unwrap(), None);
        assert_eq!(r.lines(), Vec::<String>::new(), "it was the daemon's own");
        assert_eq!(names(&dir_in(&node.plugin)), Vec::<String>::new());
    }

    #[test]
    fn loading_at_start_removes_what_was_planted_and_never_blocks() {
        for plant in EVERY_PLANT {
            let node = Node::new();
            let (out, said, log) =
                after_planting(&node, &[FILE_NAME, JOURNAL_NAME], plant, |d, r| {
                    load_all(d, r)
                });
            assert_eq!(out.unwrap(), None, "{plant:?}: read something else");
            node.untouched_elsewhere(&format!("loading {plant:?}"));
            reported_once(&said, &log, &node.at(FILE_NAME), plant);
            reported_once(&said, &log, &node.at(JOURNAL_NAME), plant);
            assert_eq!(names(&dir_in(&node.plugin)), Vec::<String>::new());
        }
    }

    #[test]
    fn a_flush_skips_what_was_planted_and_never_blocks() {
        for plant in EVERY_PLANT {
            let node = Node::new();
            let (out, said, _) =
                after_planting(&node, &[FILE_NAME, JOURNAL_NAME], plant, |d, _| flush(d));
            out.unwrap();
            assert_eq!(said, Vec::<String>::new(), "a flush removes nothing");
            node.untouched_elsewhere(&format!("flushing {plant:?}"));
        }
    }

    #[test]
    fn a_record_directory_that_is_a_link_is_refused_and_never_followed() {
        use std::os::unix::fs::symlink;
        for target in ["", "fifo", "not-yet"] {
            let node = Node::new();
            symlink(node.elsewhere.join(target), dir_in(&node.plugin)).unwrap();
            let plugin = node.plugin.clone();
            for e in returns(target, move || {
                [
                    RecordDir::open(&plugin).map(|_| ()),
                    RecordDir::open_or_create(&plugin).map(|_| ()),
                ]
            }) {
                let e = e.unwrap_err().to_string();
                assert!(
                    e.starts_with(&format!(
                        "the record directory {} is a symbolic link to \"{}\"; refusing to follow it",
                        dir_in(&node.plugin).display(),
                        node.elsewhere.join(target).display()
                    )),
                    "{e}"
                );
                assert!(e.ends_with("remove it, and the daemon makes its own directory there"));
            }
            node.untouched_elsewhere(&format!("opening a link to {target:?}"));
        }
    }

    #[test]
    fn a_record_directory_that_is_no_directory_is_refused_and_never_opened() {
        for (plant, what) in [
            (Plant::Fifo, "a FIFO"),
            (Plant::Socket, "a socket"),
            (Plant::HardLink, "a regular file"),
        ] {
            let node = Node::new();
            node.plant(&dir_in(&node.plugin), plant);
            let plugin = node.plugin.clone();
            let e = returns(what, move || RecordDir::open_or_create(&plugin).map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "the record directory {} is {what}, not a directory; refusing to use it",
                    dir_in(&node.plugin).display()
                )),
                "{e}"
            );
            node.untouched_elsewhere(&format!("opening {plant:?}"));
        }
    }

    #[test]
    fn only_a_directory_of_the_daemons_own_uid_is_used_and_only_with_mode_0700() {
        let dir = |mode, uid| Stat {
            mode: SFlag::S_IFDIR.bits() | mode,
            uid,
            nlink: 2,
        };
        assert_eq!(judge_dir(dir(0o700, 0), "a directory", 0), DirState::Ours);
        assert_eq!(
            judge_dir(dir(0o755, 0), "a directory", 0),
            DirState::Mode(0o755)
        );
        assert_eq!(
            judge_dir(dir(0o2700, 0), "a directory", 0),
            DirState::Mode(0o2700)
        );
        let DirState::Refused(why) = judge_dir(dir(0o700, 1000), "a directory", 0) else {
            panic!("another user's directory was used");
        };
        assert!(
            why.starts_with("is a directory of uid 1000, not of the daemon's uid 0; refusing"),
            "{why}"
        );
        let link = Stat {
            mode: SFlag::S_IFLNK.bits() | 0o777,
            uid: 0,
            nlink: 1,
        };
        assert!(matches!(
            judge_dir(link, "a symbolic link to \"/x\"", 0),
            DirState::Refused(why) if why.starts_with("is a symbolic link to \"/x\"; refusing to follow it")
        ));
    }

    #[test]
    fn a_looser_record_directory_is_set_back_to_0700_through_its_descriptor() {
        use std::os::unix::fs::PermissionsExt;
        let node = Node::new();
        let path = dir_in(&node.plugin);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = crate::testlog::logged(|| {
            RecordDir::open(&node.plugin).unwrap().unwrap();
        });
        assert_eq!(mode(&path), 0o700);
        assert!(
            log.contains(&format!("dir={}", path.display())) && log.contains("mode=0755"),
            "{log}"
        );
    }

    #[test]
    fn a_missing_record_directory_is_made_0700_only_for_a_write() {
        let node = Node::new();
        assert!(RecordDir::open(&node.plugin).unwrap().is_none());
        assert!(!dir_in(&node.plugin).exists(), "a read made the directory");
        RecordDir::open_or_create(&node.plugin).unwrap();
        assert_eq!(mode(&dir_in(&node.plugin)), 0o700);
    }
}
