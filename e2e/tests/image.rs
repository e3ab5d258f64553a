//! What can be checked of the image on a machine without a container engine:
//! the static build that the Containerfile runs (`hack/build-static.sh`),
//! the binaries' sizes, the paths the DaemonSet expects, and the install
//! step with the static binaries themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Whether an ELF file asks for a dynamic loader (has a `PT_INTERP` header).
fn has_interpreter(bytes: &[u8]) -> bool {
    assert_eq!(&bytes[..4], b"\x7fELF", "an ELF file");
    assert_eq!(bytes[4], 2, "64-bit");
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let ty = u32::from_le_bytes(bytes[phoff + i * phentsize..][..4].try_into().unwrap());
        ty == 3
    })
}

#[test]
fn static_binaries_build_run_and_install() {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(root().join("hack/build-static.sh"))
        .arg("")
        .arg(out.path())
        .status()
        .expect("running hack/build-static.sh");
    assert!(status.success(), "hack/build-static.sh failed");

    let cni = out.path().join("macvtap");
    let dp = out.path().join("macvtap-deviceplugin");
    for (bin, max_mib) in [(&cni, 4), (&dp, 16)] {
        let bytes = std::fs::read(bin).unwrap();
        assert!(
            !has_interpreter(&bytes),
            "{} is statically linked",
            bin.display()
        );
        let mib = bytes.len() as f64 / 1048576.0;
        println!("{}: {:.2} MiB", bin.display(), mib);
        assert!(
            mib < f64::from(max_mib),
            "{} is {mib:.2} MiB (limit {max_mib})",
            bin.display()
        );
    }
    assert!(
        has_interpreter(&std::fs::read("/bin/true").unwrap()),
        "the check can tell a dynamic binary"
    );

    // The static CNI answers VERSION.
    let v = Command::new(&cni)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    assert!(v.status.success());
    assert!(String::from_utf8_lossy(&v.stdout).contains("supportedVersions"));

    // The static daemon installs the static CNI, as the init container does.
    let host_bin = tempfile::tempdir().unwrap();
    let inst = Command::new(&dp)
        .args(["install-cni", "--source"])
        .arg(&cni)
        .arg("--target-dir")
        .arg(host_bin.path())
        .output()
        .unwrap();
    assert!(
        inst.status.success(),
        "{}",
        String::from_utf8_lossy(&inst.stderr)
    );
    assert_eq!(
        std::fs::read(host_bin.path().join("macvtap")).unwrap(),
        std::fs::read(&cni).unwrap()
    );
}

#[test]
fn the_containerfile_puts_the_binaries_where_the_daemonset_runs_them() {
    let cf = std::fs::read_to_string(root().join("Containerfile")).unwrap();
    let ds = std::fs::read_to_string(root().join("manifests/base/daemonset.yaml")).unwrap();
    for path in ["/macvtap-deviceplugin", "/macvtap"] {
        assert!(
            cf.contains(&format!("COPY --from=binaries /out{path} {path}")),
            "Containerfile copies {path}"
        );
    }
    assert!(ds.contains(r#"command: ["/macvtap-deviceplugin"]"#));
    assert!(ds.contains("- --source=/macvtap"));
    assert!(cf.contains("hack/build-static.sh x86_64-unknown-linux-musl /out"));
    assert!(cf.contains("USER 65532"), "non-root by default");
}
