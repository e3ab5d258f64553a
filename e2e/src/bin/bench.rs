//! `macvtap-bench`: runs every benchmark, prints tables, writes
//! `BENCHMARKS.md` and `benchmarks.svg`. Use `hack/bench.sh`.

use anyhow::{Context, Result};
use macvtap_e2e::bench::{cni, plot, report::Report};
use std::path::PathBuf;

fn main() -> Result<()> {
    macvtap_e2e::sandbox::require_root()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let plugins = cni::Plugins {
        ours: root.join("target/release/macvtap"),
        go_macvlan: "/usr/lib/cni/macvlan".into(),
        host_local: "/usr/lib/cni/host-local".into(),
    };
    cni::check_plugins(&plugins)?;
    let mut report = Report::default();
    report.text(&format!(
        "# Benchmarks\n\nWritten by `hack/bench.sh` on {} ({} cores). Every figure runs the \
         compared implementations interleaved in the same run; ratios are of medians.\n",
        uname(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    ));
    let mut panels = cni::per_command(&plugins, n, false, &mut report)?;
    panels.extend(cni::per_command(&plugins, n / 2, true, &mut report)?);
    let version = cni::version(&plugins, n.max(200) * 2, &mut report)?;
    panels.push(("VERSION (process overhead)".into(), version));
    cni::concurrent(&plugins, 64, &mut report)?;

    let svg = plot::cdf_svg(&panels);
    std::fs::write(root.join("benchmarks.svg"), svg).context("writing benchmarks.svg")?;
    let mut md = report.markdown().to_string();
    md.push_str("\n![latency distributions](benchmarks.svg)\n");
    std::fs::write(root.join("BENCHMARKS.md"), md).context("writing BENCHMARKS.md")?;
    println!("\nwrote BENCHMARKS.md and benchmarks.svg");
    Ok(())
}

fn uname() -> String {
    std::process::Command::new("uname")
        .arg("-sr")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
