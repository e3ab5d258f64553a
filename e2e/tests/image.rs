//! What can be checked of the image on a machine without a container engine:
//! the static build that the Containerfile runs (`hack/build-static.sh`),
//! the binaries' sizes and that they name no build-machine path, the image's
//! file system as `hack/image-rootfs.sh` lays it out (and as
//! `hack/cluster.sh image` packs it), the Go project's DaemonSet commands
//! run in it, and the install step with the static binaries themselves.
//! `tests/runtime.rs` builds the real image with podman and runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use macvtap_e2e::sandbox::require_root;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR")))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Everything in the image, as `tree` lists it: the binaries, the CNI again
/// under the Go project's name, busybox with the four applets the Go
/// project's DaemonSets run, and busybox's licence. Nothing else.
const IMAGE_TREE: [&str; 14] = [
    "bin/",
    "bin/busybox",
    "bin/cp -> busybox",
    "bin/ls -> busybox",
    "bin/sh -> busybox",
    "bin/test -> busybox",
    "macvtap",
    "macvtap-cni",
    "macvtap-deviceplugin",
    "usr/",
    "usr/share/",
    "usr/share/doc/",
    "usr/share/doc/busybox-static/",
    "usr/share/doc/busybox-static/copyright",
];

/// The entries under `dir`, sorted: `name/` for a directory, `name -> target`
/// for a symlink, `name` for a file.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = path.strip_prefix(base).unwrap().display().to_string();
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push(format!("{rel} -> {}", target.display()));
            } else if t.is_dir() {
                out.push(format!("{rel}/"));
                walk(base, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
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

/// The directories of this machine's build that a release binary must not
/// name: the repository, Cargo's home (the crates' sources) and rustup's.
fn build_machine_paths() -> Vec<String> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{home}/.cargo"));
    let rustup_home = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{home}/.rustup"));
    vec![root().display().to_string(), cargo_home, rustup_home]
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
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
        for path in build_machine_paths() {
            assert!(
                !contains(&bytes, path.as_bytes()),
                "{} names the build machine's {path} (hack/build-static.sh remaps source paths)",
                bin.display()
            );
        }
        assert!(
            contains(&bytes, b"/cargo/registry/"),
            "{}: the crates' panic locations are remapped, not gone",
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

    image_file_system_holds_what_the_go_daemonsets_run(out.path());
    cluster_image_is_that_file_system_without_a_user(out.path());
}

/// Runs `hack/image-rootfs.sh` on the static binaries in `bins` into a new
/// directory and returns it (kept in `keep`).
fn image_rootfs(bins: &Path, keep: &tempfile::TempDir) -> PathBuf {
    let rootfs = keep.path().join("rootfs");
    let out = Command::new(root().join("hack/image-rootfs.sh"))
        .arg(bins)
        .arg(&rootfs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hack/image-rootfs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    rootfs
}

/// `chroot rootfs ARGS`: the exit code and the output.
fn in_image(rootfs: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("chroot")
        .arg(rootfs)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn image_file_system_holds_what_the_go_daemonsets_run(bins: &Path) {
    let keep = tempfile::tempdir().unwrap();
    let rootfs = image_rootfs(bins, &keep);
    assert_eq!(
        tree(&rootfs),
        IMAGE_TREE,
        "the image holds this, nothing else"
    );
    let busybox = std::fs::read(rootfs.join("bin/busybox")).unwrap();
    assert!(!has_interpreter(&busybox), "busybox-static is static");
    let meta = |p: &str| std::fs::metadata(rootfs.join(p)).unwrap();
    assert_eq!(
        meta("macvtap-cni").ino(),
        meta("macvtap").ino(),
        "/macvtap-cni is the CNI binary itself"
    );
    assert_eq!(
        std::fs::read(rootfs.join("macvtap")).unwrap(),
        std::fs::read(bins.join("macvtap")).unwrap()
    );
    let copyright =
        std::fs::read_to_string(rootfs.join("usr/share/doc/busybox-static/copyright")).unwrap();
    assert!(
        copyright.contains("GNU General Public License"),
        "busybox's licence: {copyright}"
    );
    // No second run of the script over a finished file system.
    let again = Command::new(root().join("hack/image-rootfs.sh"))
        .arg(bins)
        .arg(&rootfs)
        .output()
        .unwrap();
    assert!(!again.status.success());

    require_root().unwrap();
    // The Go project's init container: `cp /macvtap-cni /host/opt/cni/bin/macvtap`.
    let host_bin = rootfs.join("host/opt/cni/bin");
    std::fs::create_dir_all(&host_bin).unwrap();
    let (code, text) = in_image(
        &rootfs,
        &["cp", "/macvtap-cni", "/host/opt/cni/bin/macvtap"],
    );
    assert_eq!(code, Some(0), "cp: {text}");
    assert_eq!(
        std::fs::read(host_bin.join("macvtap")).unwrap(),
        std::fs::read(bins.join("macvtap")).unwrap()
    );
    // Its probes, before and after the plugin's socket exists: v0.13.2's
    // `test -S` and v0.13.1's `ls`.
    let test_probe = "test -S /var/lib/kubelet/device-plugins/macvtap.network.kubevirt.io*";
    let ls_probe = "ls /var/lib/kubelet/device-plugins/macvtap.network.kubevirt.io*";
    let plugins = rootfs.join("var/lib/kubelet/device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    assert_eq!(in_image(&rootfs, &["sh", "-c", test_probe]).0, Some(1));
    assert_ne!(in_image(&rootfs, &["sh", "-c", ls_probe]).0, Some(0));
    let _socket =
        std::os::unix::net::UnixListener::bind(plugins.join("macvtap.network.kubevirt.io_dp"))
            .unwrap();
    let (code, text) = in_image(&rootfs, &["sh", "-c", test_probe]);
    assert_eq!(code, Some(0), "test -S: {text}");
    let (code, text) = in_image(&rootfs, &["sh", "-c", ls_probe]);
    assert_eq!(code, Some(0), "ls: {text}");
    // Its daemon's command line, to the point where it reads its flags.
    let (code, text) = in_image(
        &rootfs,
        &[
            "/macvtap-deviceplugin",
            "-v",
            "3",
            "-logtostderr",
            "--version",
        ],
    );
    assert_eq!(code, Some(0), "{text}");
}

fn cluster_image_is_that_file_system_without_a_user(bins: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"source "$1" && pack_our_image "$2" "$3" "$4""#)
        .arg("bash")
        .arg(root().join("hack/cluster.sh"))
        .arg("localhost/macvtap-rs:test")
        .arg(bins)
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hack/cluster.sh's pack_our_image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unpacked = dir.path().join("archive");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = |args: &[&std::ffi::OsStr]| {
        let s = Command::new("tar").args(args).status().unwrap();
        assert!(s.success(), "tar {args:?}");
    };
    tar(&[
        "-xf".as_ref(),
        archive.as_os_str(),
        "-C".as_ref(),
        unpacked.as_os_str(),
    ]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(unpacked.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest[0]["RepoTags"][0], "localhost/macvtap-rs:test");
    let config_file = manifest[0]["Config"].as_str().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(unpacked.join(config_file)).unwrap()).unwrap();
    assert_eq!(config["config"]["Entrypoint"][0], "/macvtap-deviceplugin");
    assert_eq!(
        config["config"]["User"], "",
        "root unless the pod says otherwise"
    );
    let layer = dir.path().join("layer");
    std::fs::create_dir(&layer).unwrap();
    tar(&[
        "-xf".as_ref(),
        unpacked.join("layer.tar").as_os_str(),
        "-C".as_ref(),
        layer.as_os_str(),
    ]);
    assert_eq!(
        tree(&layer),
        IMAGE_TREE,
        "hack/cluster.sh image packs the same"
    );
}

#[test]
fn the_containerfile_lays_out_the_file_system_the_daemonset_runs() {
    let root = root();
    let cf = std::fs::read_to_string(root.join("Containerfile")).unwrap();
    let ds = std::fs::read_to_string(root.join("manifests/base/daemonset.yaml")).unwrap();
    assert!(
        cf.contains("COPY --from=binaries /rootfs/ /"),
        "the whole file system"
    );
    assert!(cf.contains("hack/build-static.sh x86_64-unknown-linux-musl /out"));
    assert!(cf.contains("hack/image-rootfs.sh /out /rootfs"));
    assert!(cf.contains("COPY rootfs/ /rootfs/"), "the prebuilt context");
    assert!(
        !cf.lines().any(|l| l.trim_start().starts_with("USER")),
        "no USER: root unless the pod says otherwise"
    );
    assert!(cf.contains(r#"ENTRYPOINT ["/macvtap-deviceplugin"]"#));
    assert!(ds.contains(r#"command: ["/macvtap-deviceplugin"]"#));
    assert!(ds.contains("- --source=/macvtap"));
    let build = std::fs::read_to_string(root.join("hack/build-image.sh")).unwrap();
    assert!(
        build.contains("hack/image-rootfs.sh"),
        "--prebuilt lays out the same"
    );
    // The licence the label and Cargo.toml name is the one in LICENSE.
    assert!(cf.contains(r#"org.opencontainers.image.licenses="Apache-2.0""#));
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(cargo.contains(r#"license = "Apache-2.0""#));
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    for part in [
        "Apache License",
        "Version 2.0, January 2004",
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ] {
        assert!(
            license.contains(part),
            "LICENSE is the whole Apache-2.0 text: {part:?}"
        );
    }
}
