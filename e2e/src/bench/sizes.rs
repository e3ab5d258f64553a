//! Binary sizes of what ships and of the Go reference.

use super::cni::Plugins;
use super::report::Report;
use anyhow::Result;
use std::path::Path;

/// Sizes of our static (shipped) and dynamic release binaries, and the Go
/// `macvlan` plugin.
pub fn table(root: &Path, plugins: &Plugins, report: &mut Report) -> Result<()> {
    let go = std::fs::metadata(&plugins.go_macvlan)?.len() as f64;
    let mut md =
        String::from("| binary | size MiB | ratio to Go macvlan |\n| --- | ---: | ---: |\n");
    let rows = [
        (
            "macvtap (CNI, static, shipped)",
            root.join("target/static/macvtap"),
        ),
        (
            "macvtap-deviceplugin (static, shipped)",
            root.join("target/static/macvtap-deviceplugin"),
        ),
        (
            "macvtap (CNI, dynamic release)",
            root.join("target/release/macvtap"),
        ),
        (
            "macvtap-deviceplugin (dynamic release)",
            root.join("target/release/macvtap-deviceplugin"),
        ),
        (
            "Go macvlan (Debian containernetworking-plugins)",
            plugins.go_macvlan.clone(),
        ),
    ];
    for (name, path) in rows {
        if let Ok(m) = std::fs::metadata(&path) {
            let size = m.len() as f64;
            md.push_str(&format!(
                "| {name} | {:.2} | {:.2}x |\n",
                size / 1048576.0,
                size / go
            ));
        }
    }
    report.section("Binary sizes", "Release builds, stripped (the workspace's release profile strips); the static ones are what the image ships.");
    report.text(&md);
    Ok(())
}
