//! The test guest: Debian's cloud kernel (taken from its `.deb` with
//! `apt-get download`, never installed) and a busybox-static initramfs whose
//! `/init` loads the virtio-net modules, configures `eth0` from the kernel
//! command line, pings the peer, prints a marker on the serial console and
//! powers off (or, with `vmtest.mode=serve`, stays up answering pings, for
//! live migration). Built at test time and cached.

use crate::cpio::Cpio;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The marker the guest prints when the peer answered.
pub const PING_OK: &str = "VMTEST-PING-OK";
/// The marker the guest prints when the peer never answered.
pub const PING_FAIL: &str = "VMTEST-PING-FAIL";
/// The marker the guest prints in `vmtest.mode=serve`, once `eth0` has its
/// address and is up: it then keeps running (answering pings) until killed.
pub const SERVING: &str = "VMTEST-SERVING";

/// Kernel image and initramfs ready to boot.
#[derive(Debug, Clone)]
pub struct Guest {
    /// `vmlinuz`.
    pub kernel: PathBuf,
    /// Uncompressed newc initramfs.
    pub initrd: PathBuf,
    /// Kernel release, e.g. `6.1.0-57-cloud-amd64`.
    pub release: String,
}

/// The virtio-net driver stack, in load order (from `modinfo` dependencies).
const MODULES: [&str; 8] = [
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci",
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
];

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
IP=192.0.2.2/24; PEER=192.0.2.1; TRIES=30; MODE=ping; DUR=5
for a in $(cat /proc/cmdline); do
  case "$a" in
    vmtest.ip=*) IP=${a#vmtest.ip=};;
    vmtest.peer=*) PEER=${a#vmtest.peer=};;
    vmtest.tries=*) TRIES=${a#vmtest.tries=};;
    vmtest.mode=*) MODE=${a#vmtest.mode=};;
    vmtest.dur=*) DUR=${a#vmtest.dur=};;
  esac
done
for m in $(cat /lib/mod/order); do insmod /lib/mod/$m.ko || echo "VMTEST insmod $m failed"; done
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
echo "VMTEST eth0 mac=$(cat /sys/class/net/eth0/address 2>/dev/null) mtu=$(cat /sys/class/net/eth0/mtu 2>/dev/null) queues=$(ls -d /sys/class/net/eth0/queues/rx-* 2>/dev/null | wc -l) uptime=$(cut -d' ' -f1 /proc/uptime)"
ip link set lo up
ip addr add "$IP" dev eth0
ip link set eth0 up
if [ "$MODE" = serve ]; then
  echo "VMTEST-SERVING ip=$IP uptime=$(cut -d' ' -f1 /proc/uptime)"
  while true; do sleep 3600; done
fi
ok=0; n=0
while [ $n -lt "$TRIES" ]; do
  if ping -c 1 -W 1 "$PEER" >/dev/null 2>&1; then ok=1; break; fi
  n=$((n+1))
done
if [ $ok = 1 ]; then
  ping -c 3 -i 0.2 "$PEER"
  echo "VMTEST-PING-OK peer=$PEER failed_tries=$n uptime=$(cut -d' ' -f1 /proc/uptime)"
  if [ "$MODE" = iperf ]; then
    echo "VMTEST-IPERF-START"
    iperf3 -c "$PEER" -t "$DUR" -f m > /tmp/tx 2>&1
    echo "VMTEST-IPERF-MID"
    iperf3 -c "$PEER" -t "$DUR" -f m -R > /tmp/rx 2>&1
    echo "VMTEST-IPERF-END"
    grep -q receiver /tmp/tx || sed 's/^/VMTEST-IPERF-LOG /' /tmp/tx
    grep -q receiver /tmp/rx || sed 's/^/VMTEST-IPERF-LOG /' /tmp/rx
    echo "VMTEST-IPERF-TX $(grep receiver /tmp/tx | awk '{print $7}')"
    echo "VMTEST-IPERF-RX $(grep receiver /tmp/rx | awk '{print $7}')"
    echo "VMTEST-RTT $(ping -c 20 -i 0.2 "$PEER" | tail -1)"
  fi
else
  echo "VMTEST-PING-FAIL peer=$PEER uptime=$(cut -d' ' -f1 /proc/uptime)"
fi
sync
poweroff -f
"#;

/// Builds the guest under `cache` (reusing the extracted kernel when present).
pub fn build(cache: &Path) -> Result<Guest> {
    build_variant(cache, false)
}

/// The guest with `iperf3` and its libraries in the initramfs; with
/// `vmtest.mode=iperf` it measures TCP both ways and the ping RTT after the
/// ping check, printing `VMTEST-IPERF-*` and `VMTEST-RTT` lines.
pub fn build_with_iperf(cache: &Path) -> Result<Guest> {
    build_variant(cache, true)
}

fn build_variant(cache: &Path, iperf: bool) -> Result<Guest> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    // Tests build in parallel: one at a time per cache.
    let _lock = test_support::flock(&cache.join(".lock"))?;
    let busybox = static_busybox()?;
    let kdeb = cache.join("kdeb");
    if find_vmlinuz(&kdeb).is_none() {
        fetch_kernel(cache, &kdeb)?;
    }
    let vmlinuz = find_vmlinuz(&kdeb).context("no boot/vmlinuz-* in the kernel package")?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("odd vmlinuz name")?
        .to_string();
    let moddir = kdeb.join("lib/modules").join(&release).join("kernel");

    let initrd = cache.join(if iperf {
        "initrd-iperf.cpio"
    } else {
        "initrd.cpio"
    });
    // Written beside it and renamed over it: a test in another process may
    // be booting (QEMU reading, libvirt copying) the previous initramfs
    // right now, and must never see a half-written one.
    let partial = cache.join(format!(
        ".{}.{}",
        initrd
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("initrd"),
        std::process::id()
    ));
    let mut cpio = Cpio::new(std::io::BufWriter::new(
        std::fs::File::create(&partial)
            .with_context(|| format!("creating {}", partial.display()))?,
    ));
    for d in ["bin", "dev", "proc", "sys", "tmp", "lib", "lib/mod"] {
        cpio.dir(d)?;
    }
    if iperf {
        add_with_libraries(&mut cpio, Path::new("/usr/bin/iperf3"))?;
    }
    cpio.file("bin/busybox", 0o755, &std::fs::read(&busybox)?)?;
    let mut order = String::new();
    for m in MODULES {
        let path = moddir.join(format!("{m}.ko"));
        let data = std::fs::read(&path).with_context(|| {
            format!(
                "reading {} (compressed modules are not supported)",
                path.display()
            )
        })?;
        let base = m.rsplit('/').next().unwrap_or(m);
        cpio.file(&format!("lib/mod/{base}.ko"), 0o644, &data)?;
        order.push_str(base);
        order.push('\n');
    }
    cpio.file("lib/mod/order", 0o644, order.as_bytes())?;
    cpio.file("init", 0o755, INIT.as_bytes())?;
    std::io::Write::flush(&mut cpio.finish()?)?;
    std::fs::rename(&partial, &initrd)
        .with_context(|| format!("renaming {} to {}", partial.display(), initrd.display()))?;
    Ok(Guest {
        kernel: vmlinuz,
        initrd,
        release,
    })
}

/// Adds a dynamically linked program and every library `ldd` names, at
/// their host paths.
fn add_with_libraries<W: std::io::Write>(cpio: &mut Cpio<W>, program: &Path) -> Result<()> {
    if !program.exists() {
        bail!("{} is missing: apt-get install iperf3", program.display());
    }
    let ldd = run(Command::new("ldd").arg(program))?;
    let mut files = vec![program.to_path_buf()];
    for line in ldd.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(PathBuf::from(p));
        }
    }
    let mut dirs = std::collections::BTreeSet::new();
    for f in &files {
        let mut d = f.parent();
        while let Some(dir) = d.filter(|d| *d != Path::new("/")) {
            dirs.insert(dir.to_path_buf());
            d = dir.parent();
        }
    }
    for d in &dirs {
        let rel = d
            .strip_prefix("/")
            .unwrap_or(d)
            .to_string_lossy()
            .into_owned();
        if !["bin", "lib", "tmp"].contains(&rel.as_str()) {
            cpio.dir(&rel)?;
        }
    }
    for f in &files {
        let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let rel = f
            .strip_prefix("/")
            .unwrap_or(f)
            .to_string_lossy()
            .into_owned();
        cpio.file(&rel, 0o755, &data)?;
    }
    Ok(())
}

fn static_busybox() -> Result<PathBuf> {
    let p = PathBuf::from("/bin/busybox");
    if !p.exists() {
        bail!("{} is missing: apt-get install busybox-static", p.display());
    }
    let ldd = Command::new("ldd").arg(&p).output();
    if ldd.is_ok_and(|o| o.status.success()) {
        bail!(
            "{} is dynamically linked: apt-get install busybox-static",
            p.display()
        );
    }
    Ok(p)
}

fn find_vmlinuz(kdeb: &Path) -> Option<PathBuf> {
    std::fs::read_dir(kdeb.join("boot"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
}

/// Downloads the cloud kernel package and extracts the kernel and the
/// virtio-net modules into `kdeb`.
fn fetch_kernel(cache: &Path, kdeb: &Path) -> Result<()> {
    let deps = run(Command::new("apt-cache").args(["depends", "linux-image-cloud-amd64"]))?;
    let package = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .unwrap_or("linux-image-cloud-amd64")
        .to_string();
    let dl = tempfile::tempdir_in(cache)?;
    let download = || {
        run(Command::new("apt-get")
            .args(["download", "-q", &package])
            .current_dir(dl.path()))
    };
    if download().is_err() {
        // Package lists may be missing or stale on a fresh machine.
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        download().with_context(|| format!("apt-get download {package}"))?;
    }
    let deb = std::fs::read_dir(dl.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download produced no .deb")?;
    let _ = std::fs::remove_dir_all(kdeb);
    std::fs::create_dir_all(kdeb)?;
    let mut patterns = vec!["./boot/vmlinuz-*".to_string()];
    patterns.extend(
        MODULES
            .iter()
            .map(|m| format!("./lib/modules/*/kernel/{m}.ko*")),
    );
    let script = format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards {}",
        deb.display(),
        kdeb.display(),
        patterns
            .iter()
            .map(|p| format!("'{p}'"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    run(Command::new("sh").args(["-c", &script]))?;
    Ok(())
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
