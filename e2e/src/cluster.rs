//! The real single-node cluster of `hack/cluster.sh` as the cluster e2e
//! drives it: bring it up (or use the one that runs), `kubectl` with its
//! admin kubeconfig (a container's log followed in the background too),
//! images imported into its containerd, and the VM pod's
//! image (Debian's QEMU, its libraries and firmware, the test guest and a
//! busybox `sh` that starts QEMU on the pod's `/dev/tapN`).

pub mod realnode;

use crate::guest::Guest;
use crate::runtime::repo_root;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The cluster's node name (`hack/cluster.sh`'s `NODE_NAME`).
pub const NODE: &str = "macvtap-node";

/// What `hack/cluster.sh env` says about the running cluster.
#[derive(Debug, Clone)]
pub struct ClusterEnv {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Where the cluster's processes log (kubelet.log, containerd.log, ...).
    pub logs: PathBuf,
}

/// A cluster this process uses; it runs `hack/cluster.sh down` when dropped
/// if it was the one that brought the cluster up (and
/// `MACVTAP_CLUSTER_KEEP` is not set).
pub struct Cluster {
    env: ClusterEnv,
    started_here: bool,
}

fn script() -> PathBuf {
    repo_root().join("hack/cluster.sh")
}

/// Runs `hack/cluster.sh ARGS`, its progress lines going to our stderr.
fn cluster_sh(args: &[&str]) -> Result<String> {
    let out = Command::new(script())
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running hack/cluster.sh {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "hack/cluster.sh {} failed ({}); its last lines are above",
            args.join(" "),
            out.status
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn parse_env(text: &str) -> Result<ClusterEnv> {
    let var = |name: &str| -> Result<PathBuf> {
        text.lines()
            .filter_map(|l| l.strip_prefix("export "))
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(PathBuf::from)
            .with_context(|| format!("hack/cluster.sh env printed no {name}"))
    };
    Ok(ClusterEnv {
        kubeconfig: var("KUBECONFIG")?,
        logs: var("MACVTAP_CLUSTER_LOGS")?,
    })
}

impl Cluster {
    /// Brings the cluster up with `hack/cluster.sh up` (idempotent: a running
    /// cluster is kept and used as it is). The state of an earlier cluster
    /// whose kubelet no longer runs (a run that was killed) is brought down
    /// first, so that the cluster starts empty rather than with that run's
    /// objects in its etcd.
    pub fn up() -> Result<Self> {
        let status = cluster_sh(&["status"])?;
        let was_running = status.lines().any(|l| l.starts_with("kubelet: running"));
        let stale = status
            .lines()
            .any(|l| l.starts_with("state: ") && l != "state: none");
        if !was_running && stale {
            eprintln!(
                "an earlier cluster's state is on the machine and its kubelet does not run \
                 (a run that was killed): hack/cluster.sh down first, for an empty cluster"
            );
            cluster_sh(&["down"]).context("bringing the earlier cluster down")?;
        }
        cluster_sh(&["up"])?;
        let env = parse_env(&cluster_sh(&["env"])?)?;
        Ok(Cluster {
            env,
            started_here: !was_running,
        })
    }

    /// Whether this process brought the cluster up (rather than finding it
    /// running, with whatever an earlier run left in it).
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// What `hack/cluster.sh env` said.
    pub fn env(&self) -> &ClusterEnv {
        &self.env
    }

    /// Runs `hack/cluster.sh up` again: starts what is not running (after a
    /// test killed the kubelet, say) and waits until the node is Ready.
    pub fn ensure_up(&self) -> Result<()> {
        cluster_sh(&["up"]).map(|_| ())
    }

    /// The pid of a process `hack/cluster.sh` started (`kubelet`, ...).
    pub fn pid_of(&self, name: &str) -> Result<u32> {
        let f = Path::new("/run/macvtap-rs-cluster").join(format!("{name}.pid"));
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{} holds no pid", f.display()))
    }

    /// Builds our static binaries and imports them as `image` (`hack/cluster.sh image`).
    pub fn import_our_image(&self, image: &str) -> Result<()> {
        cluster_sh(&["image", image]).map(|_| ())
    }

    /// Packs `dir` as a one-layer image named `image` and imports it.
    pub fn import_rootfs(
        &self,
        image: &str,
        entrypoint: &[&str],
        user: &str,
        dir: &Path,
    ) -> Result<()> {
        let entry = serde_json::to_string(entrypoint)?;
        let dir = dir.to_str().context("the rootfs path is not UTF-8")?;
        cluster_sh(&["import-rootfs", image, &entry, user, dir]).map(|_| ())
    }

    /// The real `helm ARGS` (built from `hack/peers/helm/`) with the admin
    /// kubeconfig; fails with its output.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let kubeconfig = self.env.kubeconfig.to_string_lossy().into_owned();
        let mut a = args.to_vec();
        a.extend_from_slice(&["--kubeconfig", &kubeconfig]);
        crate::manifests::run_helm(&a)
    }

    /// `kubectl ARGS` with the admin kubeconfig; fails with its stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, None)
    }

    /// `kubectl ARGS` with `input` on its stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: Option<&str>) -> Result<String> {
        let out = self.kubectl_output(args, input)?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl` with the admin kubeconfig and `args`, not started.
    fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(test_kubelet::tools::venv_tool("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.env.kubeconfig).args(args);
        cmd
    }

    /// `kubectl ARGS` whatever its exit status.
    pub fn kubectl_output(&self, args: &[&str], input: Option<&str>) -> Result<Output> {
        let mut child = self
            .kubectl_command(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl (hack/setup.sh installs it into the project's venv)")?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes())?;
        }
        child.wait_with_output().context("waiting for kubectl")
    }

    /// Starts `kubectl logs -f ARGS` in the background (`what` names the
    /// log in messages); [`Self::log_to_end`] gives all it printed once the
    /// container's log ended.
    pub fn follow_logs(&self, what: &str, args: &[&str]) -> Result<LogFollower> {
        let mut a = vec!["logs", "-f"];
        a.extend_from_slice(args);
        let mut child = self
            .kubectl_command(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl (hack/setup.sh installs it into the project's venv)")?;
        let out = child.stdout.take().map(read_all_in_thread);
        let err = child.stderr.take().map(read_all_in_thread);
        Ok(LogFollower {
            what: what.to_string(),
            child,
            out,
            err,
        })
    }

    /// Waits up to `timeout` for `log`'s `kubectl logs -f` to end (the
    /// container stopped) and returns all it printed; fails when it does
    /// not end in time or exits with an error, with what it printed.
    pub fn log_to_end(&self, mut log: LogFollower, timeout: Duration) -> Result<String> {
        let ended = self.wait(&format!("the log of {} ending", log.what), timeout, || {
            Ok(log.child.try_wait()?)
        });
        let status = match ended {
            Ok(status) => status,
            Err(e) => {
                log.stop();
                let (text, _) = log.collected();
                return Err(e.context(format!("its log so far ends:\n{}", last_lines(&text, 20))));
            }
        };
        let (text, stderr) = log.collected();
        if !status.success() {
            bail!(
                "kubectl logs -f of {} failed ({status}): {}; its log so far ends:\n{}",
                log.what,
                stderr.trim(),
                last_lines(&text, 20)
            );
        }
        Ok(text)
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<Value> {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl(&a)?;
        serde_json::from_str(&text).with_context(|| format!("parsing kubectl {}", a.join(" ")))
    }

    /// `kubectl apply -f -` of one object.
    pub fn apply(&self, obj: &Value) -> Result<()> {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(&obj.to_string()))
            .map(|_| ())
    }

    /// Polls `check` every half second until it gives a value, for at most
    /// `timeout`; the error names `what` and the last reason it gave.
    pub fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            match check() {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last = format!("{e:#}"),
            }
            if start.elapsed() > timeout {
                bail!(
                    "{what}: not after {timeout:?}{}",
                    if last.is_empty() {
                        String::new()
                    } else {
                        format!(" (last: {last})")
                    }
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.started_here {
            return;
        }
        if std::env::var_os("MACVTAP_CLUSTER_KEEP").is_some() {
            eprintln!(
                "MACVTAP_CLUSTER_KEEP is set: the cluster stays up (hack/cluster.sh down ends it)"
            );
            return;
        }
        if let Err(e) = cluster_sh(&["down"]) {
            eprintln!("bringing the cluster down: {e:#}");
        }
    }
}

/// A `kubectl logs -f` of [`Cluster::follow_logs`]; dropping it ends
/// kubectl.
pub struct LogFollower {
    what: String,
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

impl LogFollower {
    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Its stdout and stderr, once kubectl exited.
    fn collected(&mut self) -> (String, String) {
        let join =
            |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        (join(self.out.take()), join(self.err.take()))
    }
}

impl Drop for LogFollower {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads `pipe` to its end in a thread of its own, so that a full pipe
/// never stalls the process writing it.
fn read_all_in_thread(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// The last `n` lines of `text`, for messages.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The VM pod's image: QEMU, its libraries and firmware, the guest's kernel
/// and initramfs, and busybox; `/vm/start` (busybox `sh`) opens the pod's
/// one `/dev/tap*` as fd 3 and execs QEMU on it (TCG, serial console on
/// stdout, the guest NIC's MAC from `$VM_MAC`, the guest's address and peer
/// from `$VM_IP` and `$VM_PEER`), as virt-launcher hands QEMU the tap fd.
pub fn vm_rootfs(guest: &Guest, dir: &Path) -> Result<()> {
    let qemu = which("qemu-system-x86_64")?;
    copy_with_libs(&qemu, dir)?;
    // Debian builds TCG as a module QEMU loads at start
    // (`/usr/lib/<triplet>/qemu/accel-tcg-x86_64.so`).
    let mut modules = 0;
    for lib in std::fs::read_dir("/usr/lib")?.flatten() {
        let Ok(entries) = std::fs::read_dir(lib.path().join("qemu")) else {
            continue;
        };
        for m in entries.flatten() {
            if m.file_name().to_string_lossy().starts_with("accel-") {
                copy_with_libs(&m.path(), dir)?;
                modules += 1;
            }
        }
    }
    if modules == 0 {
        bail!(
            "no QEMU accelerator module (/usr/lib/*/qemu/accel-*.so): is qemu-system-x86 installed whole?"
        );
    }
    for share in ["/usr/share/qemu", "/usr/share/seabios"] {
        if Path::new(share).exists() {
            copy_tree_deref(Path::new(share), &dir.join(share.trim_start_matches('/')))?;
        }
    }
    let vm = dir.join("vm");
    std::fs::create_dir_all(&vm)?;
    std::fs::copy(&guest.kernel, vm.join("vmlinuz")).context("copying the guest kernel")?;
    std::fs::copy(&guest.initrd, vm.join("initrd.cpio")).context("copying the guest initramfs")?;
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("the VM image needs /bin/busybox (apt-get install busybox-static)");
    }
    std::fs::create_dir_all(dir.join("bin"))?;
    std::fs::copy(busybox, dir.join("bin/busybox"))?;
    for applet in ["sh", "ls", "cat", "sleep"] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(applet))?;
    }
    std::fs::create_dir_all(dir.join("tmp"))?;
    std::fs::write(vm.join("start"), VM_START)?;
    set_mode(&vm.join("start"), 0o755)?;
    Ok(())
}

/// The VM pod's entrypoint (busybox `sh`).
const VM_START: &str = r#"#!/bin/sh
# The pod's one macvtap tap node, as the kubelet's DeviceSpec put it here.
set -- /dev/tap*
[ -c "$1" ] || { echo "VMPOD no /dev/tap* in this container: $(ls /dev)"; exit 1; }
echo "VMPOD tap=$1 uid=$(cat /proc/self/status | grep ^Uid)"
exec /usr/bin/qemu-system-x86_64 -accel tcg -m 192 -smp 1 -display none -vga none \
  -monitor none -no-reboot -serial stdio -nodefaults \
  -kernel /vm/vmlinuz -initrd /vm/initrd.cpio \
  -append "console=ttyS0 quiet panic=-1 vmtest.mode=serve vmtest.ip=$VM_IP vmtest.peer=$VM_PEER" \
  -netdev tap,id=n0,fd=3 -device "virtio-net-pci,netdev=n0,mac=$VM_MAC,romfile=" 3<>"$1"
"#;

fn which(name: &str) -> Result<PathBuf> {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!("{name} is not installed (hack/setup.sh installs it)")
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", p.display()))
}

/// Copies `bin` and every library `ldd` names for it (the loader too) to
/// the same paths under `root`, contents rather than links.
fn copy_with_libs(bin: &Path, root: &Path) -> Result<()> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    if !out.status.success() {
        bail!(
            "ldd {} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut files = BTreeSet::from([bin.to_path_buf()]);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.insert(PathBuf::from(p));
        }
    }
    for f in files {
        let to = root.join(f.strip_prefix("/").unwrap_or(&f));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&f, &to).with_context(|| format!("copying {}", f.display()))?;
    }
    Ok(())
}

/// Copies the tree `from` to `to`, following symlinks (QEMU's firmware
/// directory links into SeaBIOS' and iPXE's).
fn copy_tree_deref(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let src = e.path();
        let dst = to.join(e.file_name());
        let meta = match std::fs::metadata(&src) {
            Ok(m) => m,
            Err(_) => continue, // a dangling link: firmware of a package not installed
        };
        if meta.is_dir() {
            copy_tree_deref(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_are_read_by_name() {
        let env = parse_env(
            "export KUBECONFIG=/s/admin.kubeconfig\nexport MACVTAP_CLUSTER_NODE=n\nexport MACVTAP_CLUSTER_LOGS=/s/logs\n",
        )
        .unwrap();
        assert_eq!(env.kubeconfig, PathBuf::from("/s/admin.kubeconfig"));
        assert_eq!(env.logs, PathBuf::from("/s/logs"));
        assert!(parse_env("export KUBECONFIG=/k\n").is_err());
    }

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a", 5), "a");
        assert_eq!(last_lines("", 3), "");
    }
}
