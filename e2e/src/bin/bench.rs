//! `macvtap-bench`: runs every benchmark, prints tables, writes
//! `BENCHMARKS.md` and `benchmarks.svg`. Use `hack/bench.sh`.

use anyhow::{Context, Result};
use macvtap_e2e::bench::{
    burst, churn, cni, datapath, dp, dra, gobench, migration, plot, report::Report, sizes, soak,
};
use std::path::PathBuf;
use test_kubelet::TestPodResources;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    macvtap_e2e::exit::report(run().await)
}

async fn run() -> Result<()> {
    macvtap_e2e::sandbox::require_root()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let reference = test_support::gopeers::cni_plugins_dir()?;
    let plugins = cni::Plugins {
        // What ships: the static build of hack/build-static.sh.
        ours: root.join("target/static/macvtap"),
        go_macvlan: reference.join("macvlan"),
        host_local: reference.join("host-local"),
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
    // BENCH_ONLY=cni,version,... runs a subset (for profiling); the default is all.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let want = |s: &str| only.is_empty() || only.split(',').any(|o| o == s);
    let mut panels = Vec::new();
    // The Go project we replace (kubevirt/macvtap-cni v0.13.1), built once
    // from its pinned module (hack/peers/). A subset that names gocni or
    // godp fails when it cannot be built; any other run says loudly that its
    // Go columns were not run, and why, and goes on with ours.
    let go = if want("gocni") || want("godp") || want("sizes") || want("churn") {
        match gobench::GoProject::build() {
            Ok(go) => Some(go),
            Err(e) if only.is_empty() || !(want("gocni") || want("godp")) => {
                eprintln!("NOT RUN: the side-by-side figures of the Go project: {e:#}");
                report.section(
                    "Not run: the Go project side by side",
                    &format!(
                        "The side-by-side CNI and device plugin benchmarks, and the Go columns of \
                         the churn and size tables, did not run: {e:#}"
                    ),
                );
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    // BENCH_IDLE_SECS: how long the idle CPU figures watch (default 60 s).
    let idle: u64 = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    if want("cni") {
        // The test kubelet's PodResources server, for ADD's ownership check.
        let kubelet_dir = tempfile::tempdir()?;
        let pod_resources =
            TestPodResources::start(&kubelet_dir.path().join("pod-resources/kubelet.sock"))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        pod_resources.set_allocated(
            &format!("{}/bench", macvtap_link::RESOURCE_PREFIX),
            &[cni::CHECKED_DEVICE],
        );
        let settings = kubelet_dir.path().join("macvtap.settings.json");
        std::fs::write(
            &settings,
            serde_json::json!({"kubeletDir": kubelet_dir.path(), "podResourcesCheck": "enforce"})
                .to_string(),
        )?;
        let check = cni::OwnershipCheck {
            settings,
            pod_args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=test-pod".into(),
        };
        panels.extend(cni::per_command(&plugins, &check, n, false, &mut report)?);
        panels.extend(cni::per_command(&plugins, &check, n, true, &mut report)?);
    }
    if let (true, Some(go)) = (want("gocni"), &go) {
        panels.extend(gobench::cni(&plugins, go, n, &mut report)?);
    }
    if want("version") {
        let version = cni::version(&plugins, n.max(200) * 2, &mut report)?;
        panels.push(("VERSION (process overhead)".into(), version));
    }
    if want("concurrent") {
        cni::concurrent(&plugins, 64, &mut report)?;
    }
    if want("burst") {
        let rounds = std::env::var("BENCH_BURSTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        panels.push(burst::compare(&plugins.ours, rounds, &mut report).await?);
    }
    let dp_bin = root.join("target/static/macvtap-deviceplugin");
    if want("dp") {
        panels.extend(dp::all(&dp_bin, n.max(500), idle, &mut report).await?);
    }
    if let (true, Some(go)) = (want("godp"), &go) {
        // BENCH_REGISTER_TRIES: starts of each daemon timed to Register
        // (the Go one takes about 10 s each; default 3).
        let tries: usize = std::env::var("BENCH_REGISTER_TRIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3);
        panels.extend(
            gobench::device_plugins(&dp_bin, go, n.max(500), tries, idle, &mut report).await?,
        );
    }
    if want("churn") {
        let cycles: usize = std::env::var("BENCH_CHURN_CYCLES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100);
        churn::compare(
            &root.join("target/static/macvtap-deviceplugin"),
            go.as_ref().map(|g| g.deviceplugin.as_path()),
            &[10, 100, 500, 2000],
            cycles,
            &mut report,
        )
        .await?;
    }
    if want("sizes") {
        sizes::table(&root, &plugins, go.as_ref(), &mut report)?;
    }
    if want("datapath") {
        let runs: usize = std::env::var("BENCH_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3);
        datapath::compare(
            &root.join("target/static/macvtap-deviceplugin"),
            runs,
            &mut report,
        )
        .await?;
    }
    if want("migration") {
        let per_variant: usize = std::env::var("BENCH_MIGRATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(6);
        migration::compare(&root.join("target/static"), per_variant.max(5), &mut report).await?;
    }
    if want("dra") {
        // BENCH_DRA_ROUNDS VM pods per block, BENCH_DRA_BLOCKS blocks, the
        // fronts alternating (device plugin first); on the real node.
        let env = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let (per_block, blocks) = (env("BENCH_DRA_ROUNDS", 5), env("BENCH_DRA_BLOCKS", 8));
        tokio::task::block_in_place(|| dra::compare(per_block.max(1), blocks.max(2), &mut report))?;
    }
    if want("soak") {
        let lifecycles: usize = std::env::var("BENCH_SOAK_LIFECYCLES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        let seed = std::env::var("SOAK_SEED").ok().and_then(|v| v.parse().ok());
        soak::soak(lifecycles, seed, &mut report).await?;
    }
    // A subset run must not overwrite the full report.
    let out = if only.is_empty() {
        root.clone()
    } else {
        root.join("target/bench-partial")
    };
    std::fs::create_dir_all(&out)?;
    let svg = plot::cdf_svg(&panels);
    std::fs::write(out.join("benchmarks.svg"), svg).context("writing benchmarks.svg")?;
    let mut md = report.markdown().to_string();
    // Sections measured once by hand (a before/after of a change) are not
    // re-run: carried over from the file this run replaces.
    let old = std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap_or_default();
    md.push_str(&kept_sections(&old));
    md.push_str(
        "\n![latency distributions](benchmarks.svg)\n\nThe figure: the cumulative distribution of each latency series above, one panel per group of series, on a log ms axis (drawn with `plotters`).\n",
    );
    std::fs::write(out.join("BENCHMARKS.md"), md).context("writing BENCHMARKS.md")?;
    println!("\nwrote {}/BENCHMARKS.md and benchmarks.svg", out.display());
    Ok(())
}

/// The line that marks a section of BENCHMARKS.md as measured by hand,
/// which a bench run keeps as it is.
const KEPT: &str = "<!-- kept by hack/bench.sh: measured once, by hand -->";

/// The `## ` sections of `md` that hold the [`KEPT`] marker, each up to the
/// next `## ` heading or the figure.
fn kept_sections(md: &str) -> String {
    let mut out = String::new();
    let mut section = String::new();
    let flush = |section: &mut String, out: &mut String| {
        if section.contains(KEPT) {
            out.push('\n');
            out.push_str(section.trim_end());
            out.push('\n');
        }
        section.clear();
    };
    for line in md.lines() {
        if line.starts_with("## ") || line.starts_with("![") {
            flush(&mut section, &mut out);
        }
        if line.starts_with("## ") || !section.is_empty() {
            section.push_str(line);
            section.push('\n');
        }
    }
    flush(&mut section, &mut out);
    out
}

fn uname() -> String {
    std::process::Command::new("uname")
        .arg("-sr")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_marked_sections_are_kept() {
        let md = format!(
            "# Benchmarks\n\n## Measured\n\n| a |\n\n## By hand\n\n{KEPT}\n\n| b |\n\n\
             ## Also measured\n\n| c |\n\n![latency distributions](benchmarks.svg)\n\nThe figure.\n"
        );
        let kept = kept_sections(&md);
        assert_eq!(kept, format!("\n## By hand\n\n{KEPT}\n\n| b |\n"));
        assert_eq!(kept_sections(&kept), kept, "kept again on the next run");
        assert_eq!(kept_sections("# Benchmarks\n\n## Measured\n"), "");
    }
}
