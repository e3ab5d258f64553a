//! A node's container runtime for the runtime test: the DaemonSet's pod spec
//! translated into OCI runtime configs the way the kubelet and containerd's
//! CRI plugin translate them, and run by Debian's `runc`.
//!
//! What each part reproduces, and where upstream does it:
//! - defaults: containerd `oci/spec.go` (`populateDefaultUnixSpec`:
//!   `defaultUnixCaps`, masked and read-only paths, the deny-all device
//!   rule) and `oci/mounts.go` (`defaultMounts`: `/proc`, a `/dev` tmpfs,
//!   `/dev/pts`, `/dev/shm`, `/dev/mqueue`, read-only `/sys`);
//! - the container: containerd `pkg/cri/sbserver/container_create.go`
//!   (`buildLinuxSpec`: no `/run` tmpfs, `no_new_privs` only from the
//!   security context, read-only root, resources, pod namespaces) and
//!   `pkg/cri/server/container_create_linux.go` (`containerMounts`:
//!   `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`, `/dev/shm`);
//! - mounts: containerd `pkg/cri/opts/spec_linux_opts.go` (`WithMounts`:
//!   sorted by path depth, a read-only `cgroup` at `/sys/fs/cgroup`, default
//!   mounts dropped where a supplied one takes the path and everything under
//!   `/dev` dropped when `/dev` is supplied; binds `rbind` + `rprivate` +
//!   `ro`/`rw`);
//! - capabilities: containerd `pkg/cri/opts/spec_linux.go`
//!   (`WithCapabilities`: add `ALL`, drop `ALL`, then each add and drop) and
//!   `oci/spec_opts.go` (`WithAddedCapabilities`: bounding, effective and
//!   permitted alike);
//! - the kubelet: `pkg/kubelet/kuberuntime/kuberuntime_container.go`
//!   (`makeMounts`: the termination message file bound at
//!   `terminationMessagePath`), `pkg/kubelet/kubelet_pods.go`
//!   (`makeHostsMount`: the node's `/etc/hosts` copied per pod, mounted
//!   read-write, for host-network pods) and
//!   `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`
//!   (`calculateLinuxResources`: CPU shares from the request, CFS quota from
//!   the limit over a 100 ms period, the memory limit).
//!
//! Left out, on purpose: `oom_score_adj` (the kubelet gives
//! `system-node-critical` pods -997, but lowering it needs
//! `CAP_SYS_RESOURCE`, which this sandbox's bounding set lacks); seccomp and
//! AppArmor (the kubelet's default is `Unconfined` unless `seccompDefault` is
//! set, and AppArmor is not enabled here); a cgroup namespace (containerd
//! adds one only on a unified cgroup v2 host, and this one is hybrid v1);
//! the pause container (each container gets its own IPC namespace, which no
//! one can tell from the pod's, as the init container and the daemon never
//! run at once); Service environment variables (there is no API server).

use crate::sandbox::TestNs;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// containerd's default capability set (`defaultUnixCaps` in `oci/spec.go`).
pub const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Every Linux capability, indexed by its number (`linux/capability.h`).
pub const ALL_CAPS: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// containerd's default masked paths (`populateDefaultUnixSpec`); the kubelet
/// sends the same list for the `Default` proc mount.
pub const MASKED_PATHS: [&str; 10] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
];

/// containerd's default read-only paths (`populateDefaultUnixSpec`).
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The kubelet's default `terminationMessagePath`.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// The capability set containerd gives a container with `securityContext`
/// `sc` (`WithCapabilities`): the defaults, or all with `add: [ALL]`, none
/// with `drop: [ALL]`, then each `add` and each `drop`.
pub fn capabilities(sc: &Value, field: &str) -> Result<Vec<String>> {
    let list = |key: &str| -> Result<Vec<String>> {
        sc["capabilities"][key]
            .as_array()
            .map(|a| a.iter())
            .into_iter()
            .flatten()
            .map(|c| {
                let name = c
                    .as_str()
                    .with_context(|| format!("{field}.capabilities.{key}: not a string"))?
                    .to_ascii_uppercase();
                if name == "ALL" {
                    return Ok(name);
                }
                let full = format!("CAP_{name}");
                ensure!(
                    ALL_CAPS.contains(&full.as_str()),
                    "{field}.capabilities.{key}: unknown capability {name}"
                );
                Ok(full)
            })
            .collect()
    };
    let (add, drop) = (list("add")?, list("drop")?);
    let mut caps: Vec<String> = DEFAULT_CAPS.iter().map(|s| s.to_string()).collect();
    if add.iter().any(|c| c == "ALL") {
        caps = ALL_CAPS.iter().map(|s| s.to_string()).collect();
    }
    if drop.iter().any(|c| c == "ALL") {
        caps.clear();
    }
    for c in add.iter().filter(|c| *c != "ALL") {
        if !caps.contains(c) {
            caps.push(c.clone());
        }
    }
    caps.retain(|c| !drop.contains(c));
    Ok(caps)
}

/// The bit mask of capability names, as `/proc/PID/status` prints it.
pub fn cap_mask(caps: &[String]) -> Result<u64> {
    caps.iter().try_fold(0u64, |mask, c| {
        let bit = ALL_CAPS
            .iter()
            .position(|k| k == c)
            .with_context(|| format!("unknown capability {c}"))?;
        Ok(mask | 1 << bit)
    })
}

/// Names of the capabilities set in `mask`.
pub fn cap_names(mask: u64) -> Vec<String> {
    ALL_CAPS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, n)| n.to_string())
        .collect()
}

/// A Kubernetes memory quantity (`16Mi`, `1G`, `1048576`) in bytes.
pub fn memory_bytes(q: &Value, field: &str) -> Result<i64> {
    let s = match q {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => bail!("{field}: {q} is not a quantity"),
    };
    let units: [(&str, i64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| s.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((s.as_str(), 1));
    let n: i64 = num
        .parse()
        .with_context(|| format!("{field}: {s:?} is not a memory quantity this test reads"))?;
    Ok(n * mult)
}

/// A Kubernetes CPU quantity (`100m`, `1`, `0.5`) in millicores.
pub fn milli_cpu(q: &Value, field: &str) -> Result<i64> {
    let s = match q {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => bail!("{field}: {q} is not a quantity"),
    };
    if let Some(m) = s.strip_suffix('m') {
        return m
            .parse()
            .with_context(|| format!("{field}: {s:?} is not a CPU quantity"));
    }
    let cores: f64 = s
        .parse()
        .with_context(|| format!("{field}: {s:?} is not a CPU quantity"))?;
    // Kubernetes rounds CPU quantities up to whole millicores.
    Ok((cores * 1000.0).ceil() as i64)
}

/// `path` split as containerd counts depth (`orderedMounts`): `/dev` is 2,
/// `/etc/hosts` 3.
fn depth(path: &str) -> usize {
    path.trim_end_matches('/').split('/').count()
}

/// The process's uid, gid and additional gids: `runAsUser`/`runAsGroup` of
/// the container, else of the pod, else the image's `USER`; with no
/// `/etc/passwd` in the image the group is 0 unless given (containerd
/// `WithUser`, `WithAdditionalGIDs`).
fn user(sc: &Value, psc: &Value, image: &ImageConfig) -> Result<(u64, u64, Vec<u64>)> {
    let (image_uid, image_gid) = match image.user.split_once(':') {
        Some((u, g)) => (u.to_string(), Some(g.to_string())),
        None => (image.user.clone(), None),
    };
    let run_as_user = sc["runAsUser"].as_u64().or(psc["runAsUser"].as_u64());
    let uid = match run_as_user {
        Some(u) => u,
        None if image_uid.is_empty() => 0,
        None => image_uid
            .parse()
            .with_context(|| format!("the image's USER {:?} is not numeric", image.user))?,
    };
    let gid = match sc["runAsGroup"].as_u64().or(psc["runAsGroup"].as_u64()) {
        Some(g) => g,
        None if run_as_user.is_none() => match image_gid {
            Some(g) => g.parse().context("the image's USER group is not numeric")?,
            None => 0,
        },
        None => 0,
    };
    let mut gids = vec![gid];
    for g in psc["supplementalGroups"].as_array().into_iter().flatten() {
        gids.extend(g.as_u64());
    }
    gids.extend(psc["fsGroup"].as_u64());
    Ok((uid, gid, gids))
}

/// `linux.resources`: the deny-all device rule of containerd's default
/// spec, and CPU and memory as the kubelet computes them
/// (`calculateLinuxResources`) and containerd writes them (`WithResources`).
fn resources(container: &Value, field: &str) -> Result<Value> {
    let res = &container["resources"];
    let rfield = format!("{field}.resources");
    let mut memory = json!({});
    if let Some(q) = res["limits"].get("memory") {
        let limit = memory_bytes(q, &format!("{rfield}.limits.memory"))?;
        memory["limit"] = json!(limit);
        // Swap equal to the limit, so the container cannot swap, where
        // the swap controller exists.
        if Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists() {
            memory["swap"] = json!(limit);
        }
    }
    let mut cpu = json!({});
    let request = res["requests"]
        .get("cpu")
        .or(res["limits"].get("cpu"))
        .map(|q| milli_cpu(q, &format!("{rfield}.requests.cpu")))
        .transpose()?;
    if let Some(m) = request {
        cpu["shares"] = json!((m * 1024 / 1000).max(2));
    }
    if let Some(q) = res["limits"].get("cpu") {
        let m = milli_cpu(q, &format!("{rfield}.limits.cpu"))?;
        cpu["period"] = json!(100_000);
        cpu["quota"] = json!((m * 100_000 / 1000).max(1000));
    }

    Ok(json!({
        "devices": [{"allow": false, "access": "rwm"}],
        "memory": memory,
        "cpu": cpu,
    }))
}

/// The parts of an image config that shape a container's process.
#[derive(Debug, Clone, Default)]
pub struct ImageConfig {
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `CMD`.
    pub cmd: Vec<String>,
    /// `ENV`, as `KEY=value`.
    pub env: Vec<String>,
    /// `USER` (`uid` or `uid:gid`).
    pub user: String,
    /// `WORKDIR`.
    pub working_dir: String,
}

/// The runtime image, built by `hack/build-image.sh --prebuilt` with podman
/// from the static binaries, and exported as a file system tar (each
/// container gets its own unpacked copy, as containerd gives each a snapshot).
#[derive(Debug)]
pub struct Image {
    dir: tempfile::TempDir,
    /// The image's config.
    pub config: ImageConfig,
}

/// Runs `podman` on the private store `store` (cgroupfs manager: there is
/// no systemd here) and returns its stdout.
fn podman(store: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("podman")
        .env("CONTAINERS_STORAGE_CONF", store.join("storage.conf"))
        .args(["--cgroup-manager", "cgroupfs"])
        .args(args)
        .output()
        .context("running podman (hack/setup.sh installs it)")?;
    ensure!(
        out.status.success(),
        "podman {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Image {
    /// Builds the image from the static binaries in `static_dir` with the
    /// project's Containerfile, exports its file system and removes the
    /// image and the container used for the export.
    pub fn build(static_dir: &Path) -> Result<Self> {
        // A private image store (vfs: plain directories, no mounts) inside
        // the temp dir: nothing is left in the machine's podman storage,
        // not even the intermediate stage images a build keeps.
        let dir = tempfile::tempdir()?;
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store)?;
        std::fs::write(
            store.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{0}/run\"\ngraphroot = \"{0}/graph\"\n",
                store.display()
            ),
        )?;
        let tag = "localhost/macvtap-rs-runtime-test:latest";
        let out = Command::new(repo_root().join("hack/build-image.sh"))
            .env("CONTAINERS_STORAGE_CONF", store.join("storage.conf"))
            .arg("--prebuilt")
            .arg(static_dir)
            .arg(tag)
            .output()
            .context("running hack/build-image.sh")?;
        ensure!(
            out.status.success(),
            "hack/build-image.sh --prebuilt {} {tag} failed:\n{}{}",
            static_dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let inspect: Value = serde_json::from_str(&podman(&store, &["image", "inspect", tag])?)
            .context("podman image inspect printed no JSON")?;
        let c = &inspect[0]["Config"];
        let config = ImageConfig {
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            env: strings(&c["Env"]),
            user: c["User"].as_str().unwrap_or_default().to_string(),
            working_dir: c["WorkingDir"].as_str().unwrap_or_default().to_string(),
        };
        let id = podman(&store, &["create", tag])?.trim().to_string();
        let tar = dir.path().join("rootfs.tar");
        podman(&store, &["export", "-o", &tar.to_string_lossy(), &id])?;
        podman(&store, &["rm", &id])?;
        Ok(Self { dir, config })
    }

    /// Unpacks the image's file system into `dest`.
    pub fn unpack(&self, dest: &Path) -> Result<()> {
        std::fs::create_dir_all(dest)?;
        let status = Command::new("tar")
            .arg("-xf")
            .arg(self.dir.path().join("rootfs.tar"))
            .arg("-C")
            .arg(dest)
            .status()
            .context("running tar")?;
        ensure!(
            status.success(),
            "unpacking the image into {}",
            dest.display()
        );
        Ok(())
    }
}

/// The node side of one host-network pod: the node's network namespace, a
/// directory that stands for the host's file system (every `hostPath`
/// resolves under it, except `/dev`, which is the real `/dev`, so that new
/// `/dev/tapN` nodes appear), and the per-pod files the kubelet and
/// containerd make.
#[derive(Debug)]
pub struct PodSandbox {
    /// The node's network namespace (`/run/netns/...`).
    pub netns: PathBuf,
    /// The directory standing for the host's `/`.
    pub host_root: PathBuf,
    /// The pod's own directory (hosts file, resolv.conf, hostname, shm,
    /// termination logs, container logs).
    pub pod_dir: PathBuf,
    /// The rendering's ConfigMaps, for `envFrom`.
    pub config_maps: Vec<Value>,
    hostname: String,
}

impl PodSandbox {
    /// Makes the per-pod files: the node's `/etc/hosts` and
    /// `/etc/resolv.conf` copied (a host-network pod gets the node's), the
    /// node's hostname, an shm dir.
    pub fn new(
        netns: &Path,
        host_root: &Path,
        pod_dir: &Path,
        config_maps: Vec<Value>,
    ) -> Result<Self> {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_string();
        std::fs::create_dir_all(pod_dir.join("shm"))?;
        std::fs::create_dir_all(pod_dir.join("containers"))?;
        for (src, dst) in [
            ("/etc/hosts", "etc-hosts"),
            ("/etc/resolv.conf", "resolv.conf"),
        ] {
            let text = std::fs::read(src).unwrap_or_default();
            std::fs::write(pod_dir.join(dst), text)?;
        }
        std::fs::write(pod_dir.join("hostname"), format!("{hostname}\n"))?;
        Ok(Self {
            netns: netns.to_path_buf(),
            host_root: host_root.to_path_buf(),
            pod_dir: pod_dir.to_path_buf(),
            config_maps,
            hostname,
        })
    }

    /// Where the host path `path` is for this node.
    pub fn host_path(&self, path: &str) -> PathBuf {
        if path == "/dev" || path.starts_with("/dev/") {
            PathBuf::from(path)
        } else {
            self.host_root.join(path.trim_start_matches('/'))
        }
    }

    /// The container's environment as the kubelet builds it (`envFrom`
    /// ConfigMaps, then `env`), after the image's and containerd's.
    fn env(&self, c: &Value, field: &str, image: &ImageConfig) -> Result<Vec<String>> {
        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: &str| {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v.to_string()));
        };
        set(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        set("HOSTNAME", &self.hostname);
        for e in &image.env {
            let (k, v) = e.split_once('=').unwrap_or((e, ""));
            set(k, v);
        }
        for (i, from) in c["envFrom"].as_array().into_iter().flatten().enumerate() {
            let name = from["configMapRef"]["name"].as_str().with_context(|| {
                format!("{field}.envFrom[{i}]: only configMapRef is supported here")
            })?;
            let cm = self
                .config_maps
                .iter()
                .find(|cm| cm["metadata"]["name"] == name)
                .with_context(|| {
                    format!(
                        "{field}.envFrom[{i}].configMapRef: no ConfigMap {name} in the rendering"
                    )
                })?;
            let prefix = from["prefix"].as_str().unwrap_or_default();
            for (k, v) in cm["data"].as_object().into_iter().flatten() {
                set(&format!("{prefix}{k}"), v.as_str().unwrap_or_default());
            }
        }
        for (i, e) in c["env"].as_array().into_iter().flatten().enumerate() {
            let k = e["name"]
                .as_str()
                .with_context(|| format!("{field}.env[{i}].name"))?;
            // The downward API: the kubelet resolves `spec.nodeName` to the
            // node's name, by default its hostname (pkg/kubelet/kubelet_pods.go,
            // podFieldSelectorRuntimeValue).
            let field_path = e["valueFrom"]["fieldRef"]["fieldPath"].as_str();
            let v = match (e["value"].as_str(), field_path) {
                (Some(v), _) => v.to_string(),
                (None, Some("spec.nodeName")) => self.hostname.clone(),
                _ => bail!(
                    "{field}.env[{i}] ({k}): only a literal value or the fieldRef spec.nodeName is supported here"
                ),
            };
            set(k, &v);
        }
        Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    /// The OCI runtime config of `container` (an entry of the pod spec's
    /// `containers` or `initContainers`, named `field` in messages, e.g.
    /// `containers[macvtap-deviceplugin]`) in the pod `pod` (the template's
    /// `spec`), for a bundle whose root is `rootfs`, in cgroup `cgroup`.
    pub fn oci_config(
        &self,
        pod: &Value,
        container: &Value,
        field: &str,
        image: &ImageConfig,
        cgroup: &str,
    ) -> Result<Value> {
        ensure!(
            pod["hostNetwork"] == true,
            "spec.template.spec.hostNetwork: this runtime runs host-network pods only"
        );
        let sc = &container["securityContext"];
        let psc = &pod["securityContext"];
        ensure!(
            sc["privileged"] != true,
            "{field}.securityContext.privileged: the DaemonSet must not be privileged"
        );

        // Process arguments (containerd `WithProcessArgs`).
        let command = strings(&container["command"]);
        let args = strings(&container["args"]);
        let argv: Vec<String> = match (command.is_empty(), args.is_empty()) {
            (false, _) => command.into_iter().chain(args).collect(),
            (true, false) => image.entrypoint.iter().cloned().chain(args).collect(),
            (true, true) => image
                .entrypoint
                .iter()
                .chain(image.cmd.iter())
                .cloned()
                .collect(),
        };
        ensure!(
            !argv.is_empty(),
            "{field}.command: nothing to run (no command and no image entrypoint)"
        );

        let (uid, gid, gids) = user(sc, psc, image)?;
        let caps = capabilities(sc, &format!("{field}.securityContext"))?;
        let no_new_privs = sc["allowPrivilegeEscalation"] == false;
        let read_only_root = sc["readOnlyRootFilesystem"] == true;

        let mounts = self.mounts(pod, container, field, read_only_root)?;

        let resources = resources(container, field)?;

        let mut namespaces = vec![json!({"type": "mount"})];
        if pod["hostPID"] != true {
            namespaces.push(json!({"type": "pid"}));
        }
        if pod["hostIPC"] != true {
            namespaces.push(json!({"type": "ipc"}));
        }
        // hostNetwork: the node's network namespace, and the node's UTS
        // namespace (containerd leaves both out for host-network sandboxes;
        // here the node is a network namespace of its own).
        namespaces.push(json!({"type": "network", "path": self.netns}));

        let cwd = if image.working_dir.is_empty() {
            "/".to_string()
        } else {
            image.working_dir.clone()
        };
        Ok(json!({
            "ociVersion": "1.0.2-dev",
            "process": {
                "terminal": false,
                "user": {"uid": uid, "gid": gid, "additionalGids": gids},
                "args": argv,
                "env": self.env(container, field, image)?,
                "cwd": cwd,
                "capabilities": {
                    "bounding": caps, "effective": caps, "permitted": caps,
                },
                "noNewPrivileges": no_new_privs,
            },
            "root": {"path": "rootfs", "readonly": read_only_root},
            "mounts": mounts,
            "linux": {
                "namespaces": namespaces,
                "maskedPaths": MASKED_PATHS,
                "readonlyPaths": READONLY_PATHS,
                "cgroupsPath": cgroup,
                "resources": resources,
            },
        }))
    }

    /// The container's mounts as containerd's `WithMounts` lays them out:
    /// the defaults not taken by a supplied mount, then the supplied ones
    /// (the kubelet's volumeMounts, hosts file and termination message file,
    /// then containerd's own) sorted by path depth.
    fn mounts(
        &self,
        pod: &Value,
        container: &Value,
        field: &str,
        read_only_root: bool,
    ) -> Result<Vec<Value>> {
        let name = container["name"]
            .as_str()
            .with_context(|| format!("{field}.name"))?;
        // Mounts the kubelet asks for: volumeMounts, the pod's hosts file,
        // the termination message file.
        struct Bind {
            dst: String,
            src: PathBuf,
            ro: bool,
        }
        let mut cri: Vec<Bind> = Vec::new();
        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        for (i, m) in container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let mfield = format!("{field}.volumeMounts[{i}]");
            let vname = m["name"]
                .as_str()
                .with_context(|| format!("{mfield}.name"))?;
            let dst = m["mountPath"]
                .as_str()
                .with_context(|| format!("{mfield}.mountPath"))?;
            ensure!(
                m.get("subPath").is_none(),
                "{mfield}.subPath: not supported here"
            );
            let (vi, vol) = volumes
                .iter()
                .enumerate()
                .find(|(_, v)| v["name"] == vname)
                .with_context(|| format!("{mfield}.name: no volume {vname} in the pod"))?;
            let hp = vol["hostPath"]["path"].as_str().with_context(|| {
                format!("spec.template.spec.volumes[{vi}] ({vname}): only hostPath volumes are supported here")
            })?;
            let src = self.host_path(hp);
            // The kubelet checks the hostPath type before it starts the pod.
            match vol["hostPath"]["type"].as_str().unwrap_or_default() {
                "Directory" => ensure!(
                    src.is_dir(),
                    "spec.template.spec.volumes[{vi}] ({vname}).hostPath: {hp} is not a directory on this node"
                ),
                "DirectoryOrCreate" | "" => std::fs::create_dir_all(&src)?,
                other => bail!(
                    "spec.template.spec.volumes[{vi}] ({vname}).hostPath.type {other} is not supported here"
                ),
            }
            cri.push(Bind {
                dst: dst.to_string(),
                src,
                ro: m["readOnly"] == true,
            });
        }
        cri.push(Bind {
            dst: "/etc/hosts".into(),
            src: self.pod_dir.join("etc-hosts"),
            ro: false,
        });
        let term_path = container["terminationMessagePath"]
            .as_str()
            .unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH);
        let term_dir = self.pod_dir.join("containers").join(name);
        std::fs::create_dir_all(&term_dir)?;
        let term_file = term_dir.join(format!("{:08x}", COUNTER.fetch_add(1, Ordering::SeqCst)));
        std::fs::write(&term_file, "")?;
        std::fs::set_permissions(&term_file, std::fs::Permissions::from_mode(0o666))?;
        cri.push(Bind {
            dst: term_path.to_string(),
            src: term_file,
            ro: false,
        });
        // containerd's own (`containerMounts`), unless the kubelet gave them.
        for (dst, src, ro) in [
            ("/etc/hostname", "hostname", read_only_root),
            ("/etc/resolv.conf", "resolv.conf", read_only_root),
            ("/dev/shm", "shm", false),
        ] {
            if !cri.iter().any(|b| b.dst == dst) {
                cri.push(Bind {
                    dst: dst.into(),
                    src: self.pod_dir.join(src),
                    ro,
                });
            }
        }
        // Stable, so equal depths keep the kubelet's order.
        cri.sort_by_key(|b| depth(&b.dst));

        let supplied: Vec<&str> = cri.iter().map(|b| b.dst.trim_end_matches('/')).collect();
        let dev_supplied = supplied.contains(&"/dev");
        let defaults = [
            json!({"destination": "/proc", "type": "proc", "source": "proc",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                   "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                   "options": ["nosuid", "noexec", "nodev", "ro"]}),
            json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                   "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
        ];
        let mut mounts: Vec<Value> = defaults
            .into_iter()
            .filter(|m| {
                let dst = m["destination"].as_str().unwrap_or_default();
                // A supplied mount takes the path; a supplied /dev takes all of /dev.
                let taken = supplied.contains(&dst) || (dev_supplied && dst.starts_with("/dev/"));
                !taken
            })
            .collect();
        for b in &cri {
            mounts.push(json!({
                "destination": b.dst,
                "type": "bind",
                "source": b.src,
                "options": ["rbind", "rprivate", if b.ro { "ro" } else { "rw" }],
            }));
        }
        Ok(mounts)
    }
}

/// One container run by `runc run` in the foreground, as a child of the
/// test: `runc` exits with the container's exit status. Dropping it kills
/// the container and deletes it, its cgroup and its bundle.
#[derive(Debug)]
pub struct RuncContainer {
    /// The container ID.
    pub id: String,
    /// The bundle: `config.json` and `rootfs/`.
    pub bundle: tempfile::TempDir,
    state: tempfile::TempDir,
    log: PathBuf,
    child: Option<Child>,
}

impl RuncContainer {
    /// Writes a bundle for `config` with a fresh copy of `image`'s file
    /// system; the container's stdout and stderr go to `log`.
    pub fn create(id: &str, config: &Value, image: &Image, log: &Path) -> Result<Self> {
        let bundle = tempfile::tempdir()?;
        image.unpack(&bundle.path().join("rootfs"))?;
        std::fs::write(
            bundle.path().join("config.json"),
            serde_json::to_vec_pretty(config)?,
        )?;
        Ok(Self {
            id: id.to_string(),
            bundle,
            state: tempfile::tempdir()?,
            log: log.to_path_buf(),
            child: None,
        })
    }

    fn runc(&self) -> Command {
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(self.state.path());
        cmd
    }

    /// Starts `runc run` (from the test's own mount namespace, as a node's
    /// runtime runs it).
    pub fn start(&mut self) -> Result<()> {
        let log = std::fs::File::create(&self.log)?;
        let child = self
            .runc()
            .arg("run")
            .arg("--bundle")
            .arg(self.bundle.path())
            .arg(&self.id)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("running runc (hack/setup.sh installs it)")?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits up to `timeout` for the container to exit; `None` if it still
    /// runs.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let child = self
            .child
            .as_mut()
            .context("the container was not started")?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status if the container has exited, without waiting.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let child = self
            .child
            .as_mut()
            .context("the container was not started")?;
        Ok(child.try_wait()?)
    }

    /// What the container (and runc) printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The container's init process as the host sees it (`runc state`).
    pub fn pid(&self) -> Result<u32> {
        let out = self.runc().arg("state").arg(&self.id).output()?;
        ensure!(
            out.status.success(),
            "runc state {}: {}",
            self.id,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let state: Value = serde_json::from_slice(&out.stdout)?;
        ensure!(
            state["status"] == "running",
            "container {} is {}",
            self.id,
            state["status"]
        );
        let pid = state["pid"].as_u64().context("runc state has no pid")?;
        Ok(u32::try_from(pid)?)
    }

    /// `runc kill ID SIGNAL`, as the runtime stops a container.
    pub fn kill(&self, signal: &str) -> Result<()> {
        let out = self.runc().arg("kill").arg(&self.id).arg(signal).output()?;
        ensure!(
            out.status.success(),
            "runc kill {} {signal}: {}",
            self.id,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = self.kill("KILL");
                let deadline = Instant::now() + Duration::from_secs(5);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        // Removes the container's state and its cgroups.
        let _ = self
            .runc()
            .args(["delete", "--force", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A unique name for a runc container or cgroup of this test process.
pub fn unique_id(tag: &str) -> String {
    format!(
        "mvt-{}-{}-{tag}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// Reads `CapEff`, `CapPrm` and `CapBnd` of process `pid`.
pub fn process_caps(pid: u32) -> Result<[(String, u64); 3]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let get = |key: &str| -> Result<(String, u64)> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .with_context(|| format!("/proc/{pid}/status has no {key}"))?;
        Ok((key.to_string(), u64::from_str_radix(line.trim(), 16)?))
    };
    Ok([get("CapEff")?, get("CapPrm")?, get("CapBnd")?])
}

/// Sends `GET path` to `127.0.0.1:port` from inside `ns` and returns the
/// status line.
pub fn http_get(ns: &TestNs, port: u16, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let path = path.to_string();
    ns.run(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        Ok(resp.lines().next().unwrap_or_default().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_all_then_add_leaves_only_the_added() {
        let sc = json!({"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}});
        assert_eq!(capabilities(&sc, "sc").unwrap(), vec!["CAP_NET_ADMIN"]);
        assert_eq!(
            cap_mask(&capabilities(&sc, "sc").unwrap()).unwrap(),
            1 << 12
        );
    }

    #[test]
    fn without_drop_the_defaults_stay_minus_what_is_dropped() {
        let sc = json!({"capabilities": {"drop": ["NET_RAW"], "add": ["NET_ADMIN"]}});
        let caps = capabilities(&sc, "sc").unwrap();
        assert_eq!(caps.len(), DEFAULT_CAPS.len());
        assert!(caps.contains(&"CAP_NET_ADMIN".to_string()));
        assert!(!caps.contains(&"CAP_NET_RAW".to_string()));
        assert_eq!(capabilities(&json!({}), "sc").unwrap().len(), 14);
        assert!(capabilities(&json!({"capabilities": {"add": ["NOPE"]}}), "sc").is_err());
    }

    #[test]
    fn quantities_read_as_the_kubelet_reads_them() {
        assert_eq!(memory_bytes(&json!("64Mi"), "m").unwrap(), 64 << 20);
        assert_eq!(memory_bytes(&json!("1G"), "m").unwrap(), 1_000_000_000);
        assert_eq!(memory_bytes(&json!(4096), "m").unwrap(), 4096);
        assert!(memory_bytes(&json!("1.5Gi"), "m").is_err());
        assert_eq!(milli_cpu(&json!("200m"), "c").unwrap(), 200);
        assert_eq!(milli_cpu(&json!("0.5"), "c").unwrap(), 500);
        assert_eq!(milli_cpu(&json!(2), "c").unwrap(), 2000);
    }

    #[test]
    fn depth_counts_path_parts_as_containerd_does() {
        assert_eq!(depth("/dev"), 2);
        assert_eq!(depth("/dev/termination-log"), 3);
        assert_eq!(depth("/var/lib/kubelet/device-plugins/"), 5);
    }
}
