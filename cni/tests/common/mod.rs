//! CNI test fixtures: a sandbox of `test_support` namespaces that play a
//! node (with a veth as its NIC) and a pod, and a runner that executes the
//! real `macvtap` binary the way a container runtime does.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod dhcp;
pub mod kill;
pub mod kubelet;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use test_support::{TestNs, require_root, unique_ifindex};

/// How long one plugin run may take before it is killed and the test fails.
/// A run takes milliseconds, an IPAM or DHCP lease a few seconds; this
/// only stops a run that blocks (on a FIFO, a socket) from hanging the suite.
pub const PLUGIN_DEADLINE: Duration = Duration::from_secs(60);

/// A sandbox node: `node` holds the NIC `lower0` (a veth whose peer `peer0`
/// is in `peer`), `pod` is an empty pod namespace.
pub struct Sandbox {
    pub pod: TestNs,
    pub peer: TestNs,
    pub node: TestNs,
}

impl Sandbox {
    pub fn new() -> Self {
        require_root().unwrap();
        let node = TestNs::new("node").unwrap();
        let peer = TestNs::new("peer").unwrap();
        let pod = TestNs::new("pod").unwrap();
        node.add_nic_to("lower0", &peer, "peer0").unwrap();
        Sandbox { pod, peer, node }
    }

    /// Does what the device plugin's Allocate does: a macvtap named for
    /// `device_id` on `lower0` in the node namespace. Returns its ifindex.
    pub fn allocate(&self, device_id: &str) -> u32 {
        let index = unique_ifindex();
        self.allocate_at(device_id, index);
        index
    }

    /// [`Sandbox::allocate`] with a given ifindex.
    pub fn allocate_at(&self, device_id: &str, index: u32) {
        self.add_macvtap(&macvtap_link::link_name_for_device(device_id), index);
    }

    /// A bridge-mode macvtap `name` on `lower0` in the node namespace with
    /// ifindex `index` (from [`unique_ifindex`], so its `/dev/tapN` is its
    /// own).
    pub fn add_macvtap(&self, name: &str, index: u32) {
        let index = index.to_string();
        self.node
            .ip(&[
                "link", "add", name, "index", &index, "link", "lower0", "type", "macvtap", "mode",
                "bridge",
            ])
            .unwrap();
    }

    /// Runs the real plugin inside the node namespace.
    pub fn cni(&self, command: &str, conf: &Value, extra_env: &[(&str, &str)]) -> CniRun {
        let env = self.cni_env(command, extra_env);
        run_plugin(&self.node.name, &env, conf.to_string().as_bytes())
    }

    /// The environment [`Sandbox::cni`] runs the plugin with: the pod's
    /// namespace, `net1`, `extra_env` replacing or adding variables.
    pub fn cni_env<'a>(
        &self,
        command: &str,
        extra_env: &[(&'a str, &str)],
    ) -> Vec<(&'a str, String)> {
        let mut env = vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", format!("ctr-{}", self.pod.name)),
            ("CNI_NETNS", self.pod.path()),
            ("CNI_IFNAME", "net1".to_string()),
            (
                "CNI_PATH",
                test_support::gopeers::cni_plugins_dir()
                    .unwrap()
                    .display()
                    .to_string(),
            ),
        ];
        for (k, v) in extra_env {
            env.retain(|(e, _)| e != k);
            env.push((k, v.to_string()));
        }
        env
    }

    /// The addresses (`addr/prefix`) on `net1` in the pod.
    pub fn pod_addrs(&self) -> Vec<String> {
        let out = self.pod.ip(&["-j", "addr", "show", "dev", "net1"]).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        v[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .collect()
    }

    /// `ip -d -j link show` of one link in a namespace, or None.
    pub fn link(&self, ns: &TestNs, name: &str) -> Option<Value> {
        ns.link_json(name).unwrap()
    }

    /// What the host namespace looks like, to compare before and after.
    pub fn node_links(&self) -> Vec<(u64, String, String, u64, String)> {
        links_summary(&self.node)
    }
}

/// The result of one plugin run.
#[derive(Debug)]
pub struct CniRun {
    pub code: i32,
    /// The signal that ended the run, if one did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CniRun {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?} / stderr {}",
                self.stdout, self.stderr
            )
        })
    }

    pub fn ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "plugin failed: {} / stderr {}",
            self.stdout, self.stderr
        );
        self
    }

    /// Asserts failure with the given spec code; returns the message.
    pub fn fails_with(&self, code: u64) -> String {
        assert_eq!(
            self.code, 1,
            "expected failure, got {} / {}",
            self.stdout, self.stderr
        );
        let v = self.json();
        assert_eq!(
            v["code"].as_u64(),
            Some(code),
            "wrong code: {v} / stderr {}",
            self.stderr
        );
        v["msg"].as_str().unwrap().to_string()
    }
}

/// Node settings for runs that bring none: a kubelet dir that does not
/// exist, so no test ever asks a PodResources socket it did not start (the
/// real host path may be served by another test meanwhile), and `warn`.
fn isolated_settings() -> String {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // One shared file, always the same bytes, replaced atomically.
        let path = std::env::temp_dir().join("macvtap-cni-test-settings.json");
        let tmp = path.with_extension(format!("json.{}", std::process::id()));
        std::fs::write(
            &tmp,
            r#"{"kubeletDir":"/nonexistent/kubelet","podResourcesCheck":"warn"}"#,
        )
        .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path.display().to_string()
    })
    .clone()
}

pub fn run_plugin(netns: &str, env: &[(&str, String)], stdin: &[u8]) -> CniRun {
    run_plugin_under(netns, &[], env, stdin)
}

/// [`run_plugin`] with the plugin started by `wrapper` (e.g. `strace` and
/// its arguments), which must exec it with the environment it got.
pub fn run_plugin_under(
    netns: &str,
    wrapper: &[&str],
    env: &[(&str, String)],
    stdin: &[u8],
) -> CniRun {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns])
        .args(wrapper)
        .arg(env!("CARGO_BIN_EXE_macvtap"))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("MACVTAP_CNI_SETTINGS", isolated_settings())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Its own process group: a run past the deadline is killed with all it
    // started (an IPAM plugin), so nothing keeps its pipes open.
    cmd.process_group(0);
    let command = env
        .iter()
        .find(|(k, _)| *k == "CNI_COMMAND")
        .map_or("(no CNI_COMMAND)", |(_, v)| v.as_str());
    let mut child = cmd.spawn().unwrap();
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap());
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    // Fed from a thread, so that a plugin that never reads cannot block here.
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let out = match finished.recv_timeout(PLUGIN_DEADLINE) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            let stderr = finished
                .recv_timeout(Duration::from_secs(10))
                .ok()
                .and_then(Result::ok)
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            panic!(
                "the plugin's {command} did not finish within {PLUGIN_DEADLINE:?} and was \
                 killed; stderr: {stderr}"
            );
        }
    };
    feeder.join().unwrap();
    CniRun {
        code: out.status.code().unwrap_or(-1),
        signal: std::os::unix::process::ExitStatusExt::signal(&out.status),
        stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// (ifindex, name, kind, mtu, mac) of every link in a namespace.
pub fn links_summary(ns: &TestNs) -> Vec<(u64, String, String, u64, String)> {
    ns.links_json()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["ifindex"].as_u64().unwrap(),
                l["ifname"].as_str().unwrap().to_string(),
                l["linkinfo"]["info_kind"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                l["mtu"].as_u64().unwrap(),
                l["address"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// `user:group` numeric owner and major:minor of a device node.
pub fn node_owner(path: &str) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.uid(), m.gid()))
}

/// A NetConf for the plugin.
pub fn netconf(version: &str, device_id: &str) -> Value {
    serde_json::json!({
        "cniVersion": version,
        "name": "dataplane",
        "type": "macvtap",
        "deviceID": device_id,
    })
}
