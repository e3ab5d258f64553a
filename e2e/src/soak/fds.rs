//! What a process's descriptors are: each `/proc/<pid>/fd` entry with its
//! target, a socket told apart by its family from the process's
//! `/proc/<pid>/net` tables (netlink with its protocol and groups, unix
//! with its path), so a soak can account for every one it holds.

use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// One open descriptor of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fd {
    /// The descriptor number.
    pub fd: u32,
    /// What it is, e.g. `netlink route` or `anon_inode:[eventpoll]`.
    pub what: String,
    /// Whether it lacks close-on-exec: every descriptor Rust's standard
    /// library and tokio open has it, so one without it was inherited from
    /// whoever started the process.
    pub inherited: bool,
}

impl fmt::Display for Fd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.fd, self.what)?;
        if self.inherited {
            f.write_str(" (inherited)")?;
        }
        Ok(())
    }
}

/// One a line, as `fd: what`.
pub fn render(fds: &[Fd]) -> String {
    fds.iter().map(|f| format!("  {f}\n")).collect()
}

/// The descriptors of process `pid`, in descriptor order. One that closes
/// while it is read is left out.
pub fn list(pid: u32) -> Result<Vec<Fd>> {
    let sockets = socket_table(pid);
    let dir = format!("/proc/{pid}/fd");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let e = e?;
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let what = match target
            .strip_prefix("socket:[")
            .and_then(|i| i.strip_suffix(']'))
        {
            // The kind first, the inode last, as `kinds` counts them.
            Some(inode) => sockets.get(inode).cloned().unwrap_or_else(|| {
                format!("socket in neither namespace's tables (closing, or another namespace's):[{inode}]")
            }),
            None => target,
        };
        let flags = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        let inherited = flags
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .is_some_and(|f| f & nix::libc::O_CLOEXEC as u32 == 0);
        out.push(Fd {
            fd,
            what,
            inherited,
        });
    }
    out.sort_by_key(|f| f.fd);
    Ok(out)
}

/// How many descriptors of each kind `fds` holds, e.g. `netlink route: 3`.
pub fn kinds(fds: &[Fd]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for f in fds {
        *m.entry(kind(&f.what)).or_insert(0) += 1;
    }
    m
}

/// The kind of a descriptor: its description without the inode numbers
/// that tell two of a kind apart.
fn kind(what: &str) -> String {
    match what.find(":[") {
        Some(i)
            if what[i + 2..]
                .trim_end_matches(']')
                .bytes()
                .all(|b| b.is_ascii_digit()) =>
        {
            what[..i].to_string()
        }
        _ => what.to_string(),
    }
}

/// Socket inode to description, from the tables of `pid`'s network
/// namespace (unreadable tables give nothing: the inode is shown bare).
fn socket_table(pid: u32) -> HashMap<String, String> {
    let mut m = HashMap::new();
    // A unix socket accepted from a client in another namespace is in the
    // client's namespace's table: read the caller's too (the soak's kubelet
    // and its client connect from it). The header lines are skipped.
    let read = |t: &str| {
        let own = std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).unwrap_or_default();
        let here = std::fs::read_to_string(format!("/proc/self/net/{t}")).unwrap_or_default();
        own.lines()
            .skip(1)
            .chain(here.lines().skip(1))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
    for line in read("netlink") {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 10 {
            let proto = match f[1] {
                "0" => "route".to_string(),
                other => format!("protocol {other}"),
            };
            let groups = match f[3] {
                "00000000" => String::new(),
                g => format!(" groups {g}"),
            };
            m.insert(f[9].to_string(), format!("netlink {proto}{groups}"));
        }
    }
    // Num RefCount Protocol Flags Type St Inode Path
    for line in read("unix") {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 7 {
            let state = match f[5] {
                "01" => "listening",
                "03" => "connected",
                _ => "unconnected",
            };
            let state = if f[3] == "00010000" {
                "listening"
            } else {
                state
            };
            let path = f.get(7).map(|p| format!(" {p}")).unwrap_or_default();
            m.insert(f[6].to_string(), format!("unix {state}{path}"));
        }
    }
    for (t, name) in [
        ("tcp", "tcp"),
        ("tcp6", "tcp6"),
        ("udp", "udp"),
        ("udp6", "udp6"),
    ] {
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        for line in read(t) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 10 {
                m.insert(f[9].to_string(), format!("{name} {}", f[1]));
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_own_descriptors_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let fds = list(std::process::id()).unwrap();
        let what = |fd: &dyn std::os::fd::AsRawFd| {
            let n = fd.as_raw_fd() as u32;
            fds.iter().find(|f| f.fd == n).unwrap().clone()
        };
        let shown = path.display();
        assert_eq!(what(&listener).what, format!("unix listening {shown}"));
        assert_eq!(what(&accepted).what, format!("unix connected {shown}"));
        assert_eq!(what(&client).what, "unix connected");
        assert_eq!(what(&file).what, "/dev/null");
        assert!(!what(&file).inherited, "opened with close-on-exec");
        assert_eq!(kind("anon_inode:[eventpoll]"), "anon_inode:[eventpoll]");
        assert_eq!(kind("pipe:[1234]"), "pipe");
        assert_eq!(kind("netlink route"), "netlink route");
    }
}
