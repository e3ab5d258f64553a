//! A sandbox node driven the way a real node drives our binaries: network
//! namespaces for the node, its pods and a peer host; a veth pair as the
//! node's NIC; a temp dir as the kubelet dir; the real
//! `macvtap-deviceplugin` registering with a test kubelet that allocates
//! devices. The real Multus runs the CNI on it (`crate::multus`).

use crate::sandbox::TestNs;
use anyhow::{Context, Result, ensure};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_kubelet::{Daemon, PluginClient, TestKubelet, TestPodResources};
use test_support::tap_node_lock;
use test_support::tapnode::UNIQUE_IFINDEX_BASE;

/// The tests' tap-node lock (see `tap_node_lock`), shared by every node of
/// one test: an `flock` taken twice in one process, on two descriptors,
/// would wait for itself, so the nodes of a two-node test hold one guard.
pub type TapLock = Arc<nix::fcntl::Flock<std::fs::File>>;

/// Takes the tap-node lock for one test (one or more nodes).
pub fn tap_lock() -> Result<TapLock> {
    // Fresh namespaces number links from 1; see `tap_node_lock`.
    Ok(Arc::new(tap_node_lock()?))
}

/// The peer host's address on the NIC's segment.
pub const PEER_IP: &str = "192.0.2.1";
/// The VM's address.
pub const GUEST_IP: &str = "192.0.2.2/24";
/// How long the e2e waits for the daemon and the kubelet (a deadline, not a
/// latency target).
pub const WAIT: Duration = Duration::from_secs(10);

/// How long [`run_cni`] lets a plugin run before it kills it (a deadline
/// for a hung plugin, not a latency target: the CNI's own longest wait is
/// its 5 s PodResources budget).
pub const CNI_DEADLINE: Duration = Duration::from_secs(60);

/// Path of one of the workspace's binaries, next to the running executable
/// (`target/<profile>/`). It is built with cargo when it is missing or older
/// than a source file of its crate or of the workspace crates it links
/// (`macvtap-link`, `proto`), so a run of `-p macvtap-e2e` alone never
/// drives a stale binary. A current binary is left alone: rebuilding it with
/// other features while other tests run it would swap it under them.
pub fn binary(package: &str, name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("exe has no dir")?.to_path_buf();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    let path = dir.join(name);
    let crate_dir = match package {
        "macvtap-cni" => "cni",
        "macvtap-deviceplugin" => "device-plugin",
        other => other,
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let sources = [crate_dir, "macvtap-link", "proto"].map(|d| root.join(d));
    let built = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    let stale = match built {
        None => true,
        Some(built) => sources.iter().any(|d| newer_than(d, built)),
    };
    if stale {
        let release = dir.ends_with("release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", package, "--bin", name]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().context("running cargo build")?;
        ensure!(
            status.success(),
            "cargo build -p {package} --bin {name} failed"
        );
    }
    ensure!(
        path.exists(),
        "{} is missing after the build",
        path.display()
    );
    Ok(path)
}

/// Whether a file under `dir` (skipping `target`) was modified after `t`.
fn newer_than(dir: &Path, t: std::time::SystemTime) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(ft) = e.file_type() else { return false };
        if ft.is_dir() {
            e.file_name() != "target" && newer_than(&e.path(), t)
        } else {
            e.metadata().and_then(|m| m.modified()).is_ok_and(|m| m > t)
        }
    })
}

/// The NIC, the peer host, the kubelet dir, the test kubelet and the daemon.
pub struct Node {
    /// The node's network namespace (the "host" namespace of this node).
    pub ns: TestNs,
    /// The peer host at [`PEER_IP`] on the other end of the NIC (shared by
    /// the nodes of one L2 segment, see [`crate::switch::Segment`]).
    pub peer: Arc<TestNs>,
    /// The kubelet's root dir.
    pub kubelet_dir: tempfile::TempDir,
    /// The test kubelet, once started.
    pub kubelet: Option<TestKubelet>,
    /// The kubelet's PodResources API, once started.
    pub pod_resources: Option<TestPodResources>,
    daemon: Option<Daemon>,
    /// The log of the last daemon started, kept after it stops.
    daemon_log: Option<PathBuf>,
    _tap_lock: TapLock,
}

/// The device plugin flags the node e2e uses: reclaim quickly, so that a
/// test can watch the link of a deleted pod go away.
pub const FAST_RECLAIM: [&str; 4] = ["--reclaim-interval", "200ms", "--reclaim-grace", "1s"];

/// A device the test kubelet got from the plugin.
#[derive(Debug, Clone)]
pub struct Allocation {
    /// Device ID, e.g. `dataplaneMvp0`.
    pub device_id: String,
    /// `DeviceSpec.host_path`, e.g. `/dev/tap5`.
    pub host_path: PathBuf,
    /// How long the Allocate call took.
    pub took: Duration,
}

impl Node {
    /// Makes the namespaces: `lower0` in the node, `peer0` with [`PEER_IP`]/24
    /// in the peer.
    pub fn new() -> Result<Self> {
        let lock = tap_lock()?;
        let ns = TestNs::new("node")?;
        let peer = TestNs::new("peer")?;
        ns.add_nic_to("lower0", &peer, "peer0")?;
        peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "peer0"])?;
        Self::with_nic(ns, Arc::new(peer), lock)
    }

    /// A node whose NIC `lower0` is already wired in `ns` (e.g. to a switch
    /// port), reaching `peer`; `lock` is the test's one tap-node lock.
    pub fn with_nic(ns: TestNs, peer: Arc<TestNs>, lock: TapLock) -> Result<Self> {
        let kubelet_dir = tempfile::tempdir()?;
        std::fs::create_dir_all(kubelet_dir.path().join("device-plugins"))?;
        Ok(Node {
            ns,
            peer,
            kubelet_dir,
            kubelet: None,
            pod_resources: None,
            daemon: None,
            daemon_log: None,
            _tap_lock: lock,
        })
    }

    /// `<kubelet dir>/device-plugins`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.path().join("device-plugins")
    }

    /// Serves the kubelet's Registration API on `kubelet.sock`.
    pub async fn start_kubelet(&mut self) -> Result<()> {
        let k = TestKubelet::start(&self.plugin_dir())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.kubelet = Some(k);
        Ok(())
    }

    /// Serves the kubelet's PodResources API on
    /// `<kubelet dir>/pod-resources/kubelet.sock`, with nothing allocated.
    pub async fn start_pod_resources(&mut self) -> Result<()> {
        let socket = self.kubelet_dir.path().join("pod-resources/kubelet.sock");
        let p = TestPodResources::start(&socket)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.pod_resources = Some(p);
        Ok(())
    }

    /// Makes PodResources report `ids` of `resource` (full name) as held by
    /// pod `namespace/name`, as the kubelet does once it has allocated them.
    pub fn hold_pod(
        &self,
        namespace: &str,
        name: &str,
        resource: &str,
        ids: &[&str],
    ) -> Result<()> {
        let p = self
            .pod_resources
            .as_ref()
            .context("PodResources not started")?;
        p.set_pod(namespace, name);
        p.set_allocated(resource, ids);
        Ok(())
    }

    /// Makes PodResources report `ids` of `resource` (full name) as held by
    /// the current pod; `&[]` when the pod is gone.
    pub fn hold(&self, resource: &str, ids: &[&str]) -> Result<()> {
        self.pod_resources
            .as_ref()
            .context("PodResources not started")?
            .set_allocated(resource, ids);
        Ok(())
    }

    /// Checks that CNI DEL gave `device_id`'s macvtap back to the node
    /// namespace, down, with ifindex `index` (so its `/dev/tapN` still holds).
    pub fn returned_link(&self, device_id: &str, index: u32) -> Result<()> {
        let name = macvtap_link::link_name_for_device(device_id);
        let out = self.ns.ip(&["-j", "link", "show", "dev", &name])?;
        let v: Value = serde_json::from_str(&out)?;
        let link = &v[0];
        ensure!(
            link["ifindex"].as_u64() == Some(u64::from(index)),
            "{name} came back with ifindex {} instead of {index}",
            link["ifindex"]
        );
        ensure!(
            !link["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "UP")),
            "{name} came back up"
        );
        Ok(())
    }

    /// Waits until the device plugin's reclaim has removed every `mvt…` link
    /// from the node namespace (after the pod is gone and the grace passed).
    pub fn wait_for_reclaim(&self) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left: Vec<String> = self
                .ns
                .links()?
                .into_iter()
                .filter(|l| l.starts_with("mvt"))
                .collect();
            if left.is_empty() {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the device plugin did not reclaim {left:?} within {WAIT:?}; daemon log:\n{}",
                self.daemon_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the real daemon in the node namespace with `DP_MACVTAP_CONF`
    /// set to `conf` and `args` (`test_kubelet::Daemon`); its log goes to a
    /// file in the kubelet dir.
    pub fn start_device_plugin(&mut self, conf: &str, args: &[&str]) -> Result<u32> {
        let bin = binary("macvtap-deviceplugin", "macvtap-deviceplugin")?;
        self.start_device_plugin_bin(&bin, conf, args)
    }

    /// [`Node::start_device_plugin`] with a given binary (the benchmarks run
    /// the shipped static build).
    pub fn start_device_plugin_bin(
        &mut self,
        bin: &std::path::Path,
        conf: &str,
        args: &[&str],
    ) -> Result<u32> {
        let kubelet_dir = self.kubelet_dir.path().to_string_lossy().into_owned();
        let mut all = vec!["--kubelet-dir", kubelet_dir.as_str()];
        // Metrics off unless the test serves them.
        if !args.iter().any(|a| a.starts_with("--metrics-addr")) {
            all.extend(["--metrics-addr", "off"]);
        }
        all.extend_from_slice(args);
        // The daemon's own default level unless the run asks for another.
        let level = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let env = [("DP_MACVTAP_CONF", conf), ("RUST_LOG", level.as_str())];
        let daemon = Daemon::start(bin, &self.ns, self.kubelet_dir.path(), &all, &env)
            .context("starting macvtap-deviceplugin")?;
        let pid = daemon.pid();
        self.daemon_log = Some(daemon.log_path().to_path_buf());
        self.daemon = Some(daemon);
        Ok(pid)
    }

    /// The daemon's log so far (the last daemon's, once it stopped).
    pub fn daemon_log(&self) -> String {
        self.daemon_log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Stops the daemon with SIGTERM and checks it exits 0.
    pub fn stop_device_plugin(&mut self) -> Result<()> {
        let Some(mut d) = self.daemon.take() else {
            return Ok(());
        };
        d.signal(nix::sys::signal::Signal::SIGTERM)?;
        let status = d.wait_exit(WAIT).context("after SIGTERM")?;
        ensure!(
            status.success(),
            "daemon exited with {status}: {}",
            self.daemon_log()
        );
        Ok(())
    }

    /// Kills the daemon with SIGKILL (a crash, an OOM kill) and waits for
    /// it to be gone; its sockets stay behind, as a killed process leaves them.
    pub fn kill_device_plugin(&mut self) -> Result<()> {
        let Some(mut d) = self.daemon.take() else {
            return Ok(());
        };
        d.signal(nix::sys::signal::Signal::SIGKILL)?;
        d.wait_exit(WAIT).context("after SIGKILL")?;
        Ok(())
    }

    /// The running daemon's process ID.
    pub fn device_plugin_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|d| d.pid())
    }

    /// Waits for `resource` to register and for the kubelet to list
    /// `capacity` healthy devices, and returns a client of the plugin socket.
    pub async fn plugin(&self, resource: &str, capacity: usize) -> Result<PluginClient> {
        let kubelet = self.kubelet.as_ref().context("kubelet not started")?;
        let full = format!("{}/{resource}", macvtap_link::RESOURCE_PREFIX);
        let reg = kubelet
            .wait_for_registration(&full, 0, WAIT)
            .await
            .map_err(|e| anyhow::anyhow!("{e}; daemon log:\n{}", self.daemon_log()))?;
        ensure!(
            reg.version == "v1beta1",
            "registered with version {}",
            reg.version
        );
        // The kubelet opens ListAndWatch itself; wait for what it learned.
        kubelet
            .wait_resource(&full, WAIT, |v| {
                v.connected
                    && v.devices.len() == capacity
                    && v.devices.iter().all(|d| d.health == "Healthy")
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}; daemon log:\n{}", self.daemon_log()))?;
        let client = kubelet
            .connect(&reg.endpoint)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(client)
    }

    /// Allocates one device as the kubelet does when a pod is admitted.
    pub async fn allocate(client: &mut PluginClient, device_id: &str) -> Result<Allocation> {
        let t = Instant::now();
        let resp = client.allocate(&[device_id]).await?;
        let took = t.elapsed();
        let spec = resp
            .container_responses
            .first()
            .and_then(|c| c.devices.first())
            .context("Allocate returned no DeviceSpec")?;
        ensure!(
            spec.host_path == spec.container_path,
            "host and container paths differ: {spec:?}"
        );
        ensure!(
            spec.permissions == "rw",
            "permissions {:?}",
            spec.permissions
        );
        Ok(Allocation {
            device_id: device_id.to_string(),
            host_path: spec.host_path.clone().into(),
            took,
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The daemon goes before its namespace.
        self.daemon.take();
        // Namespaces die asynchronously, and with them their macvtaps and
        // /dev/tapN nodes; delete the macvtaps now, while the tap-node lock
        // is held, so the next sandbox cannot meet a stale node.
        let _ = self.ns.delete_macvtaps();
    }
}

impl Allocation {
    /// The ifindex in `/dev/tap<ifindex>`.
    pub fn ifindex(&self) -> Result<u32> {
        self.host_path
            .to_str()
            .and_then(|p| p.strip_prefix("/dev/tap"))
            .and_then(|i| i.parse().ok())
            .with_context(|| format!("{} is not /dev/tapN", self.host_path.display()))
    }
}

/// The `/dev/tapN` nodes that exist now, below [`UNIQUE_IFINDEX_BASE`]: the
/// e2e's macvtaps get kernel-chosen (or, on a second node, low fixed)
/// ifindexes under the tap-node lock, while tests that run beside them may
/// make and remove their own at `unique_ifindex`es at any moment.
pub fn tap_nodes() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.strip_prefix("tap")
                        .and_then(|i| i.parse::<u32>().ok())
                        .is_some_and(|i| i < UNIQUE_IFINDEX_BASE)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Checks after a test's teardown: no `mvt…` link on `node`, no `/dev/tap*`
/// node beyond `taps_before`, and none of the processes `pids` alive.
pub fn nothing_left(node: &Node, taps_before: &[String], pids: &[u32]) -> Result<()> {
    let leftover: Vec<String> = node
        .ns
        .links()?
        .into_iter()
        .filter(|l| l.starts_with("mvt"))
        .collect();
    ensure!(leftover.is_empty(), "links left on the node: {leftover:?}");
    let extra: Vec<String> = tap_nodes()
        .into_iter()
        .filter(|t| !taps_before.contains(t))
        .collect();
    ensure!(extra.is_empty(), "tap nodes left behind: {extra:?}");
    for pid in pids {
        ensure!(!alive(*pid), "process {pid} is still running");
    }
    Ok(())
}

/// Whether process `pid` still exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// One call of our CNI plugin as the runtime runs Multus's delegate: inside
/// the node's namespace, with nothing but the CNI variables.
pub struct CniCall<'a> {
    /// The plugin binary.
    pub cni: &'a Path,
    /// The node namespace's name.
    pub node_ns: &'a str,
    /// `CNI_COMMAND`.
    pub command: &'a str,
    /// `CNI_NETNS`; the container ID is derived from its last component.
    pub netns: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// `CNI_ARGS`.
    pub args: &'a str,
    /// The NetConf on stdin.
    pub conf: &'a str,
    /// The node settings file (`MACVTAP_CNI_SETTINGS`), if any.
    pub settings: Option<&'a Path>,
}

/// Runs `call` and returns the plugin's stdout (the result); a failure
/// carries its stdout and stderr.
pub fn run_cni(call: &CniCall) -> Result<String> {
    let out = run_cni_output(call, &[])?;
    ensure!(
        out.status.success(),
        "{} {} failed: {} {}",
        call.cni.display(),
        call.command,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `call` with `wrapper` (a program and its arguments, e.g. `strace`
/// injecting a kill; empty for none) in front of the plugin, and returns
/// how it ended, failed or not. A plugin still running after
/// [`CNI_DEADLINE`] is killed and reported as an error.
pub fn run_cni_output(call: &CniCall, wrapper: &[&str]) -> Result<std::process::Output> {
    use std::io::Write;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", call.node_ns])
        .args(wrapper)
        .arg(call.cni)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", call.command)
        .env(
            "CNI_CONTAINERID",
            format!("sandbox-{}", call.netns.rsplit('/').next().unwrap_or("x")),
        )
        .env("CNI_NETNS", call.netns)
        .env("CNI_IFNAME", call.ifname)
        .env("CNI_PATH", test_support::gopeers::cni_plugins_dir()?)
        .env("CNI_ARGS", call.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(settings) = call.settings {
        cmd.env("MACVTAP_CNI_SETTINGS", settings);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", call.cni.display()))?;
    child
        .stdin
        .take()
        .context("the plugin's stdin")?
        .write_all(call.conf.as_bytes())?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(CNI_DEADLINE) {
        Ok(out) => Ok(out?),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            anyhow::bail!(
                "{} {} did not finish within {CNI_DEADLINE:?}; killed it",
                call.cni.display(),
                call.command
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn a_source_newer_than_the_binary_is_seen_and_target_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src/sub")).unwrap();
        std::fs::create_dir_all(dir.path().join("target")).unwrap();
        let before = SystemTime::now() - Duration::from_secs(60);
        std::fs::write(dir.path().join("target/new"), "").unwrap();
        assert!(!newer_than(
            dir.path(),
            SystemTime::now() + Duration::from_secs(60)
        ));
        assert!(!newer_than(dir.path(), before), "target/ was read");
        std::fs::write(dir.path().join("src/sub/lib.rs"), "").unwrap();
        assert!(newer_than(dir.path(), before));
    }
}
