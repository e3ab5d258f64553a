//! Killing the real plugin with SIGKILL right after one of its link changes,
//! with no hook in the plugin: `strace` runs it, logs its netlink requests
//! and answers (`sendto`, `recvfrom`, all on its main thread), and injects
//! SIGKILL on entry of a chosen `recvfrom`. The kernel applies an rtnetlink
//! request inside the `sendto` that carries it, so a kill on entry of the
//! next `recvfrom` (the wait for the answer) lands right after the change
//! took effect and before anything after it ran.

use super::{CniRun, run_plugin_under};

/// The strace a test needs; hack/setup.sh installs it.
const STRACE: &str = "/usr/bin/strace";

/// A plugin run under strace, and strace's log of it.
pub struct Traced {
    pub run: CniRun,
    pub log: String,
}

impl Traced {
    /// The log lines of the plugin's main thread (the one that opened the
    /// first netlink request), without the thread id.
    fn main_thread(&self) -> Vec<&str> {
        let first = self
            .log
            .lines()
            .find(|l| l.contains(" sendto("))
            .and_then(|l| l.split_once(' '))
            .map(|(pid, _)| pid)
            .unwrap_or_else(|| panic!("no netlink request in the log:\n{}", self.log));
        // strace pads the thread id to a width of five.
        self.log
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(pid, _)| *pid == first)
            .map(|(_, rest)| rest.trim_start())
            .collect()
    }

    /// How many link changes (`RTM_SETLINK` requests: a move, a rename, a
    /// state, MAC or alias change) the plugin sent.
    pub fn setlinks(&self) -> usize {
        self.main_thread()
            .iter()
            .filter(|l| is_setlink_request(l))
            .count()
    }

    /// The number (from 1) of the `recvfrom` that waits for the answer to
    /// the `k`-th link change.
    pub fn recv_after_setlink(&self, k: usize) -> usize {
        let lines = self.main_thread();
        let at = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| is_setlink_request(l))
            .nth(k - 1)
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no link change {k} in the log:\n{}", self.log));
        lines[..at]
            .iter()
            .filter(|l| l.starts_with("recvfrom("))
            .count()
            + 1
    }

    /// Asserts that SIGKILL ended the plugin inside a `recvfrom` right
    /// after its `k`-th link change, with nothing printed.
    pub fn assert_killed_after_setlink(&self, k: usize) {
        assert_eq!(
            self.run.signal,
            Some(nix::libc::SIGKILL),
            "the plugin was not killed: exit {} / {} / stderr {}",
            self.run.code,
            self.run.stdout,
            self.run.stderr
        );
        assert_eq!(self.run.stdout, "", "a killed plugin prints nothing");
        let lines = self.main_thread();
        let last = lines.last().copied().unwrap_or_default();
        assert!(
            last.starts_with("recvfrom(") && last.contains("<unfinished ...>"),
            "the kill did not land in a recvfrom: {last}\n{}",
            self.log
        );
        let last_send = lines
            .iter()
            .rev()
            .find(|l| l.starts_with("sendto("))
            .copied()
            .unwrap_or_default();
        assert!(
            is_setlink_request(last_send),
            "the last request is not a link change: {last_send}"
        );
        assert_eq!(self.setlinks(), k, "link changes sent before the kill");
    }
}

/// Whether `line` (a main-thread log line) sends an `RTM_SETLINK` request;
/// strace names the type on a socket of its own namespace and prints its
/// number (0x13) on the pod's.
fn is_setlink_request(line: &str) -> bool {
    line.starts_with("sendto(")
        && (line.contains("nlmsg_type=RTM_SETLINK,") || line.contains("nlmsg_type=0x13 "))
}

/// Runs the plugin in `netns` under strace with `env` and `stdin`; with
/// `kill_at`, SIGKILL hits it on entry of its `kill_at`-th `recvfrom`.
pub fn run_traced(
    netns: &str,
    env: &[(&str, String)],
    stdin: &[u8],
    kill_at: Option<usize>,
) -> Traced {
    assert!(
        std::path::Path::new(STRACE).exists(),
        "NOT RUN: {STRACE} is missing; hack/setup.sh installs strace"
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("strace.log");
    let log_arg = log.display().to_string();
    let inject = kill_at.map(|n| format!("inject=recvfrom:signal=SIGKILL:when={n}"));
    let mut wrapper = vec![
        STRACE,
        "-f",
        "-q",
        "-o",
        &log_arg,
        "-e",
        "trace=sendto,recvfrom",
        "-e",
        "signal=none",
    ];
    if let Some(inject) = &inject {
        wrapper.extend(["-e", inject.as_str()]);
    }
    wrapper.push("--");
    let run = run_plugin_under(netns, &wrapper, env, stdin);
    let log = std::fs::read_to_string(&log).unwrap();
    Traced { run, log }
}
