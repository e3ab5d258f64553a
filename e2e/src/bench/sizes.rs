//! Binary sizes of what ships, beside the Go project we replace and the
//! reference plugins' Go `macvlan`.

use super::cni::Plugins;
use super::gobench::GoProject;
use super::report::Report;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Sizes of our static (shipped) and dynamic release binaries, each with its
/// ratio to the Go project's counterpart (kubevirt/macvtap-cni v0.13.1, as
/// `go build` makes it with CGO off) when `go` is given, and the reference
/// plugins' Go `macvlan` for scale.
pub fn table(
    root: &Path,
    plugins: &Plugins,
    go: Option<&GoProject>,
    report: &mut Report,
) -> Result<()> {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len() as f64).ok();
    let go_cni = go.and_then(|g| size(&g.cni));
    let go_dp = go.and_then(|g| size(&g.deviceplugin));
    let mut md = String::from(
        "| binary | size MiB | ratio to the Go project's counterpart |\n| --- | ---: | ---: |\n",
    );
    // Cargo's release output, where cargo writes it ($CARGO_TARGET_DIR when set).
    let release = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("release");
    let rows: [(&str, PathBuf, Option<f64>); 7] = [
        (
            "macvtap (CNI, static, shipped)",
            root.join("target/static/macvtap"),
            go_cni,
        ),
        (
            "macvtap-deviceplugin (static, shipped)",
            root.join("target/static/macvtap-deviceplugin"),
            go_dp,
        ),
        (
            "macvtap (CNI, dynamic release)",
            release.join("macvtap"),
            go_cni,
        ),
        (
            "macvtap-deviceplugin (dynamic release)",
            release.join("macvtap-deviceplugin"),
            go_dp,
        ),
        (
            "Go v0.13.1 cni (CGO off, as built)",
            go.map(|g| g.cni.clone()).unwrap_or_default(),
            go_cni,
        ),
        (
            "Go v0.13.1 deviceplugin (CGO off, as built)",
            go.map(|g| g.deviceplugin.clone()).unwrap_or_default(),
            go_dp,
        ),
        (
            "Go macvlan (reference CNI plugins v1.10.0, another plugin, for scale)",
            plugins.go_macvlan.clone(),
            None,
        ),
    ];
    for (name, path, reference) in rows {
        if let Some(s) = size(&path) {
            md.push_str(&size_row(name, s, reference));
        }
    }
    report.section(
        "Binary sizes",
        "Our release builds are stripped (the workspace's release profile strips); the static \
         ones are what the image ships. The Go project's binaries are as `go build` makes them \
         from its source (CGO off, not stripped, as its `cmd/Dockerfile` builds them).",
    );
    report.text(&md);
    Ok(())
}

/// One table row: `name`, `bytes` in MiB and the ratio to `reference` bytes
/// (empty without one).
fn size_row(name: &str, bytes: f64, reference: Option<f64>) -> String {
    let ratio = reference
        .filter(|r| *r > 0.0)
        .map_or_else(String::new, |r| format!("{:.2}x", bytes / r));
    format!("| {name} | {:.2} | {ratio} |\n", bytes / 1048576.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_gives_mib_and_the_ratio_to_its_counterpart() {
        let mib = 1048576.0;
        assert_eq!(
            size_row("ours", 2.0 * mib, Some(4.0 * mib)),
            "| ours | 2.00 | 0.50x |\n"
        );
        assert_eq!(size_row("other", mib, None), "| other | 1.00 |  |\n");
        assert_eq!(size_row("other", mib, Some(0.0)), "| other | 1.00 |  |\n");
    }
}
