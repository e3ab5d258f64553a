//! The standard `process_*` metrics, read from `/proc/self` as the Go
//! client's process collector reads them (`prometheus/procfs`: `stat`,
//! `limits`, the entries of `fd`, and `btime` from `/proc/stat`), and the
//! [`ProcessCollector`] that puts them on the metrics page.
//!
//! Kept by hand on purpose: the one maintained process collector for
//! `prometheus-client` (`kubert-prometheus-process` 0.2.3, of the kubert
//! project) is built on an older `prometheus-client` (0.23, so a second
//! copy of it in the binary), pulls `procfs` with `rustix`, and adds metrics
//! README does not list (network bytes, threads) with help texts of other
//! wording; the crates of the other metrics stacks (`metrics-process`, the
//! `prometheus` crate's `process` feature) bring their own registry. Five
//! `/proc` reads are less code than any of them.

use crate::error::{Error, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::path::Path;

/// One reading of the process's resource use.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_memory_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_memory_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors, if there is one.
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// The fields of `/proc/<pid>/stat` the metrics need, in clock ticks and
/// pages as the kernel gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StatFields {
    /// `utime`, field 14.
    pub utime: u64,
    /// `stime`, field 15.
    pub stime: u64,
    /// `starttime` since boot, field 22.
    pub starttime: u64,
    /// `vsize` in bytes, field 23.
    pub vsize: u64,
    /// `rss` in pages, field 24.
    pub rss: u64,
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(Error::io("reading", path))
}

fn bad(path: &str, what: &str) -> Error {
    Error::io("reading", path)(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        what.to_string(),
    ))
}

/// Parses `/proc/<pid>/stat`; the command name may hold spaces and
/// parentheses, so fields are counted from its last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<StatFields> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name, field 3 (state) is the first.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(StatFields {
        utime: field(14)?,
        stime: field(15)?,
        starttime: field(22)?,
        vsize: field(23)?,
        rss: field(24)?,
    })
}

/// The boot time (`btime`, seconds since the epoch) from `/proc/stat`.
pub(crate) fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft "Max open files" limit from `/proc/<pid>/limits`; `None` when
/// it is `unlimited` or missing.
pub(crate) fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn sysconf(var: nix::unistd::SysconfVar, path: &str) -> Result<u64> {
    match nix::unistd::sysconf(var) {
        Ok(Some(v)) if v > 0 => Ok(v as u64),
        _ => Err(bad(path, "sysconf gave no value")),
    }
}

impl ProcessStats {
    /// Reads the numbers of the calling process.
    pub(crate) fn read_self() -> Result<Self> {
        let stat_path = "/proc/self/stat";
        let stat = parse_stat(&read(stat_path)?)
            .ok_or_else(|| bad(stat_path, "unexpected format of /proc/self/stat"))?;
        let btime = parse_btime(&read("/proc/stat")?)
            .ok_or_else(|| bad("/proc/stat", "no btime line in /proc/stat"))?;
        let ticks = sysconf(nix::unistd::SysconfVar::CLK_TCK, stat_path)? as f64;
        let page = sysconf(nix::unistd::SysconfVar::PAGE_SIZE, stat_path)?;
        let fd_dir = Path::new("/proc/self/fd");
        let open_fds = std::fs::read_dir(fd_dir)
            .map_err(Error::io("listing", fd_dir))?
            .count() as u64;
        let max_fds = parse_max_fds(&read("/proc/self/limits")?);
        Ok(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_memory_bytes: stat.rss * page,
            virtual_memory_bytes: stat.vsize,
            // The directory handle `read_dir` held is one of the entries.
            open_fds: open_fds.saturating_sub(1),
            max_fds,
            start_time_seconds: btime as f64 + stat.starttime as f64 / ticks,
        })
    }
}

/// Puts the `process_*` metrics on the page, read anew at each scrape.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        // Without /proc (never the case on a node) the page just lacks them.
        let Ok(p) = ProcessStats::read_self() else {
            return Ok(());
        };
        ConstCounter::new(p.cpu_seconds).encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        let int = |v: u64| ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
        let mut gauge = |name: &str, help: &str, g: &dyn EncodeMetric| {
            g.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
        };
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            &int(p.resident_memory_bytes),
        )?;
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            &int(p.virtual_memory_bytes),
        )?;
        gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            &int(p.open_fds),
        )?;
        if let Some(max) = p.max_fds {
            gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                &int(max),
            )?;
        }
        gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            &ConstGauge::new(p.start_time_seconds),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let s = "29446 (we ird) (name) R 29442 29442 21111 0 -1 4194304 101 0 0 0 \
                 7 3 0 0 20 0 1 0 291933 3133440 390 18446744073709551615 0";
        assert_eq!(
            parse_stat(s),
            Some(StatFields {
                utime: 7,
                stime: 3,
                starttime: 291933,
                vsize: 3133440,
                rss: 390
            })
        );
        assert_eq!(parse_stat("1 (x) R 1 2"), None);
    }

    #[test]
    fn btime_and_fd_limit() {
        assert_eq!(
            parse_btime("cpu  1 2 3\nbtime 1796011880\nprocesses 9\n"),
            Some(1796011880)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    #[test]
    fn reads_this_process() {
        let before = ProcessStats::read_self().unwrap();
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let after = ProcessStats::read_self().unwrap();
        drop(f);
        assert_eq!(after.open_fds, before.open_fds + 1);
        assert!(before.resident_memory_bytes > 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            before.start_time_seconds <= now && before.start_time_seconds > now - 86400.0 * 365.0
        );
    }
}
