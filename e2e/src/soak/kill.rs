//! A CNI run killed at its k-th netlink send by `strace`'s fault injection,
//! and what the trace says it did: the netlink messages it sent, in order,
//! and whether it died at the one chosen or ended first. The soak checks
//! that a run it meant to kill was killed (a run that failed on its own is
//! a failure, not a kill) and prints what each send was.

use std::fmt;

/// The `strace` arguments (before the program) that kill the traced
/// process on entry to its `at`-th `sendto` and write every `sendto` to
/// `out`: the sends before it took effect, nothing after them runs.
pub fn strace_args(at: u64, out: &str) -> Vec<String> {
    [
        "strace",
        "-f",
        "-qq",
        "-o",
        out,
        "-e",
        "trace=sendto",
        "-e",
        &format!("inject=sendto:signal=KILL:when={at}"),
    ]
    .map(str::to_string)
    .to_vec()
}

/// What the trace of one run says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sends {
    /// Each netlink send, as `RTM_NEWLINK NLM_F_REQUEST|NLM_F_ACK`.
    pub messages: Vec<String>,
    /// Whether the process was killed (at the last of `messages`).
    pub killed: bool,
}

impl Sends {
    /// Reads `strace -o` output.
    pub fn parse(trace: &str) -> Self {
        let mut s = Sends::default();
        for line in trace.lines() {
            if line.contains("+++ killed by SIGKILL") {
                s.killed = true;
            }
            let Some(call) = line.split_once("sendto(").map(|(_, c)| c) else {
                continue;
            };
            let field = |name: &str| {
                call.split_once(&format!("{name}="))
                    .and_then(|(_, r)| r.split([',', '}']).next())
                    .unwrap_or("?")
                    .to_string()
            };
            s.messages
                .push(format!("{} {}", field("nlmsg_type"), field("nlmsg_flags")));
        }
        s
    }
}

impl fmt::Display for Sends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.messages.len();
        if self.killed {
            write!(f, "killed at netlink send {n}")?;
        } else {
            write!(f, "ended by itself after {n} netlink sends")?;
        }
        if n > 0 {
            write!(f, " [{}]", self.messages.join("; "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_run_and_one_that_ended_are_told_apart() {
        let killed = "1195  sendto(3, [{nlmsg_len=32, nlmsg_type=RTM_GETLINK, \
                      nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK, nlmsg_seq=0}, {}], 32, 0, NULL, 0) = 32\n\
                      1195  sendto(3, [{nlmsg_len=32, nlmsg_type=RTM_NEWLINK, \
                      nlmsg_flags=NLM_F_REQUEST|NLM_F_ACK, nlmsg_seq=1}], 32, 0, NULL, 0) = ?\n\
                      1195  +++ killed by SIGKILL +++\n";
        let s = Sends::parse(killed);
        assert!(s.killed);
        assert_eq!(
            s.messages,
            [
                "RTM_GETLINK NLM_F_REQUEST|NLM_F_ACK",
                "RTM_NEWLINK NLM_F_REQUEST|NLM_F_ACK"
            ]
        );
        assert!(s.to_string().starts_with("killed at netlink send 2 ["));
        let ended = Sends::parse("1196  +++ exited with 0 +++\n");
        assert_eq!(ended.to_string(), "ended by itself after 0 netlink sends");
    }
}
