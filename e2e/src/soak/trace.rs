//! What each step of a soak decided and met, kept so that a failure can say
//! it: the choices come from the seed, but some outcomes still depend on
//! timing (whether a freed device's link was still on the node when it was
//! allocated again, where a killed CNI run died, what the daemon's reclaim
//! did meanwhile). A failure prints the steps about the failing device and
//! the daemon log cut to the lines about it.

use std::fmt;

/// One thing a step did or met.
#[derive(Debug, Clone)]
pub struct Event {
    /// The step's number, from 1.
    pub step: usize,
    /// The device it concerns, if any.
    pub device: Option<String>,
    /// What happened, in words.
    pub text: String,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.device {
            Some(d) => write!(f, "step {} [{d}]: {}", self.step, self.text),
            None => write!(f, "step {}: {}", self.step, self.text),
        }
    }
}

/// The events of a run, in order.
#[derive(Debug, Default)]
pub struct Trace {
    events: Vec<Event>,
    step: usize,
}

impl Trace {
    /// Starts step `step`.
    pub fn begin(&mut self, step: usize) {
        self.step = step;
    }

    /// Records `text` about `device` (or about the node, with `None`).
    pub fn note(&mut self, device: Option<&str>, text: impl Into<String>) {
        self.events.push(Event {
            step: self.step,
            device: device.map(str::to_string),
            text: text.into(),
        });
    }

    /// The device the current step is about: the last one it noted.
    pub fn current_device(&self) -> Option<&str> {
        self.events
            .iter()
            .rev()
            .take_while(|e| e.step == self.step)
            .find_map(|e| e.device.as_deref())
    }

    /// The last `n` events about `device` and the current step's, in order,
    /// one a line.
    pub fn about(&self, device: Option<&str>, n: usize) -> String {
        let mut picked: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| e.step == self.step || (device.is_some() && e.device.as_deref() == device))
            .collect();
        if device.is_none() {
            picked = self.events.iter().collect();
        }
        let from = picked.len().saturating_sub(n);
        picked[from..]
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The lines of `log` about `device`: those naming it, its link `link` or
/// its tap node `/dev/tap<ifindex>` (`ifindex=<ifindex>` or `tap<ifindex>`
/// not followed by a digit), and every warning and error; the last `n`.
pub fn log_about(log: &str, device: &str, link: &str, ifindex: Option<u32>, n: usize) -> String {
    let tap = ifindex.map(|i| (format!("tap{i}"), format!("ifindex={i}")));
    let names_index = |line: &str, pat: &str| {
        line.match_indices(pat).any(|(at, _)| {
            !line[at + pat.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
    };
    let picked: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(device)
                || l.contains(link)
                || l.contains(" WARN ")
                || l.contains(" ERROR ")
                || tap
                    .as_ref()
                    .is_some_and(|(t, i)| names_index(l, t) || names_index(l, i))
        })
        .collect();
    let from = picked.len().saturating_sub(n);
    picked[from..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_cut_to_the_device_its_link_and_its_tap_node() {
        let log = "\
a INFO created macvtap device_id=dpMvp1 ifname=mvt1 tap=/dev/tap8\n\
b INFO created macvtap device_id=dpMvp2 ifname=mvt2 tap=/dev/tap80\n\
c INFO deleted a leaked macvtap ifname=mvt1\n\
d INFO re-created ifindex=8\n\
e INFO re-created ifindex=81\n\
f  WARN something else\n";
        let cut = log_about(log, "dpMvp1", "mvt1", Some(8), 10);
        assert_eq!(
            cut.lines().map(|l| &l[..1]).collect::<String>(),
            "acdf",
            "{cut}"
        );
        assert_eq!(
            log_about(log, "dpMvp1", "mvt1", Some(8), 2).lines().count(),
            2
        );
    }

    #[test]
    fn a_failure_shows_the_device_s_steps_and_the_current_one() {
        let mut t = Trace::default();
        t.begin(1);
        t.note(Some("a"), "Allocate a");
        t.begin(2);
        t.note(Some("b"), "Allocate b");
        t.begin(3);
        t.note(None, "kubelet restart");
        t.note(Some("a"), "DEL a");
        assert_eq!(t.current_device(), Some("a"));
        let about = t.about(Some("a"), 10);
        assert_eq!(
            about,
            "step 1 [a]: Allocate a\nstep 3: kubelet restart\nstep 3 [a]: DEL a"
        );
    }
}
