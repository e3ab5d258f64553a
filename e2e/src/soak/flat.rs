//! Whether a process's descriptors and memory stayed flat over a soak: one
//! sample per lifecycle, and growth judged after a stated warm-up, so that
//! a pool filling up (a handle opened by the first Allocate and kept, the
//! kubelet's and the test's connections, the allocator's arenas as threads
//! start) passes and a leak (something more per lifecycle, for good) fails.
//!
//! The rule: the first [`WARM_UP`] lifecycles of the process do not count.
//! The median of the [`WINDOW`] samples right after them is the level; the
//! median of the last [`WINDOW`] may exceed it by at most [`FD_SLACK`]
//! descriptors and by at most a fifth (and 2 MiB) of resident memory.
//! Medians, so that a call in flight at one sample does not count.

use anyhow::{Context, Result, ensure};

/// Lifecycles a process runs before its samples count: the daemon's pools
/// fill in its first few (its first Allocate opens the host handle it
/// keeps; the kubelet's ListAndWatch and the test's client connect).
pub const WARM_UP: usize = 20;
/// Samples per median.
pub const WINDOW: usize = 9;
/// How far the median of descriptors may rise after the warm-up: a
/// connection of the kubelet's that outlives a restart by a sample or two,
/// not one per lifecycle.
pub const FD_SLACK: u64 = 1;

/// A process's open descriptors and resident memory after a lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The process ID (a daemon restart changes it).
    pub pid: u32,
    /// Lifecycles completed when it was taken.
    pub lifecycles: usize,
    /// Entries in `/proc/<pid>/fd`.
    pub fds: usize,
    /// VmRSS in KiB.
    pub rss_kib: u64,
}

/// Samples process `pid` after `lifecycles` lifecycles.
pub fn sample(pid: u32, lifecycles: usize) -> Result<Sample> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    Ok(Sample {
        pid,
        lifecycles,
        fds,
        rss_kib,
    })
}

/// Checks that the last process sampled stayed flat after its warm-up (see
/// the module docs); an earlier process's samples (a daemon restarted)
/// do not count.
pub fn check_flat(samples: &[Sample]) -> Result<()> {
    let last_pid = samples.last().context("no samples")?.pid;
    let own: Vec<&Sample> = samples.iter().filter(|s| s.pid == last_pid).collect();
    ensure!(
        own.len() >= WARM_UP + 4 * WINDOW,
        "the last daemon ran only {} lifecycles: too few to tell flat from growing after a \
         warm-up of {WARM_UP}",
        own.len()
    );
    let median = |w: &[&Sample], f: fn(&Sample) -> u64| {
        let mut v: Vec<u64> = w.iter().map(|s| f(s)).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (early, late) = (&own[WARM_UP..WARM_UP + WINDOW], &own[own.len() - WINDOW..]);
    let span = own.len() - WARM_UP;
    let (fds0, fds1) = (
        median(early, |s| s.fds as u64),
        median(late, |s| s.fds as u64),
    );
    ensure!(
        fds1 <= fds0 + FD_SLACK,
        "the daemon's descriptors grew from {fds0} to {fds1} (medians) over {span} lifecycles \
         after a warm-up of {WARM_UP}: {:?}",
        own.iter().map(|s| s.fds).collect::<Vec<_>>()
    );
    let (rss0, rss1) = (median(early, |s| s.rss_kib), median(late, |s| s.rss_kib));
    let allowed = rss0 + (rss0 / 5).max(2048);
    ensure!(
        rss1 <= allowed,
        "the daemon's memory grew from {rss0} KiB to {rss1} KiB (medians) over {span} \
         lifecycles after a warm-up of {WARM_UP}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

    fn s(pid: u32, lifecycles: usize, fds: usize, rss_kib: u64) -> Sample {
        Sample {
            pid,
            lifecycles,
            fds,
            rss_kib,
        }
    }

    #[test]
    fn growing_descriptors_or_memory_of_the_last_daemon_fail() {
        let flat: Vec<Sample> = (0..80)
            .map(|i| s(2, i, 20 + (i % 7 == 0) as usize * 5, 9000))
            .collect();
        check_flat(&flat).unwrap();
        let mut leak = flat.clone();
        for (i, x) in leak.iter_mut().enumerate() {
            x.fds = 20 + i / 8;
        }
        assert!(
            check_flat(&leak)
                .unwrap_err()
                .to_string()
                .contains("descriptors")
        );
        let mut bloat = flat.clone();
        for x in bloat.iter_mut().skip(60) {
            x.rss_kib = 12000;
        }
        assert!(
            check_flat(&bloat)
                .unwrap_err()
                .to_string()
                .contains("memory")
        );
        // An earlier daemon's samples do not count.
        let mut restarted: Vec<Sample> = (0..5).map(|i| s(1, i, 90, 90000)).collect();
        restarted.extend(flat);
        check_flat(&restarted).unwrap();
    }

    /// A real process whose descriptors and memory a test drives: each
    /// lifecycle it opens the descriptors and grows by the KiB it is told,
    /// and says when it has.
    struct Process {
        child: Child,
        to: ChildStdin,
        from: BufReader<ChildStdout>,
    }

    /// For each line `<descriptors> <KiB>`: opens that many descriptors
    /// (kept, as a pool or a leak keeps them) and grows a string by that
    /// many KiB, then answers `ok`.
    const SCRIPT: &str = r#"big=""
while read n k; do
  for ((i = 0; i < n; i++)); do exec {fd}</dev/null; done
  if [ "$k" -gt 0 ]; then printf -v more "%0$((k * 1024))d" 0; big+=$more; fi
  echo ok
done"#;

    impl Process {
        fn start() -> Self {
            let mut child = Command::new("bash")
                .args(["-c", SCRIPT])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let to = child.stdin.take().unwrap();
            let from = BufReader::new(child.stdout.take().unwrap());
            Process { child, to, from }
        }

        /// One lifecycle: `fds` more descriptors, `kib` more memory; then a
        /// sample, taken once the process says it is done.
        fn lifecycle(&mut self, i: usize, fds: usize, kib: usize) -> Sample {
            writeln!(self.to, "{fds} {kib}").unwrap();
            let mut line = String::new();
            self.from.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "ok");
            sample(self.child.id(), i).unwrap()
        }
    }

    impl Drop for Process {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// 80 lifecycles of a real process: a pool of 6 descriptors and 4 MiB
    /// filled in its first 12 (within the warm-up), then, with `leak`, one
    /// more descriptor every 8 lifecycles, or 100 KiB each.
    fn run(leak_fds: bool, leak_kib: bool) -> Result<()> {
        let mut p = Process::start();
        let samples: Vec<Sample> = (0..80)
            .map(|i| {
                let pool = i < 12;
                let fds = usize::from(pool && i % 2 == 0) + usize::from(leak_fds && i % 8 == 7);
                let kib = if pool {
                    340
                } else {
                    usize::from(leak_kib) * 100
                };
                p.lifecycle(i, fds, kib)
            })
            .collect();
        assert!(
            samples[79].fds > samples[0].fds,
            "the pool filled: {samples:?}"
        );
        check_flat(&samples)
    }

    #[test]
    fn a_pool_filled_during_the_warm_up_passes_and_a_leak_after_it_fails() {
        run(false, false).unwrap();
        let e = run(true, false).unwrap_err().to_string();
        assert!(e.contains("descriptors grew"), "{e}");
        let e = run(false, true).unwrap_err().to_string();
        assert!(e.contains("memory grew"), "{e}");
    }
}
