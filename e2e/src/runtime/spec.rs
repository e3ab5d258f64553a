//! The OCI runtime config of one container of a host-network pod, as the
//! kubelet and containerd's CRI plugin build it: defaults from containerd
//! `oci/spec.go` (`populateDefaultUnixSpec`: masked and read-only paths, the
//! deny-all device rule), the container from
//! `pkg/cri/sbserver/container_create.go` (`buildLinuxSpec`: no `/run`
//! tmpfs, `no_new_privs` only from the security context, read-only root, resources, pod
//! namespaces), the process's user (`WithUser`, `WithAdditionalGIDs`), the
//! environment (`envFrom`, `env`, the downward API's `spec.nodeName`), and
//! resources from the kubelet's
//! `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`
//! (`calculateLinuxResources`: CPU shares from the request, CFS quota from
//! the limit over a 100 ms period, the memory limit). The mounts are in
//! [`super::mounts`]. A `privileged` container gets what containerd's
//! `oci.WithPrivileged`, `WithHostDevices` and `WithAllDevicesAllowed` give
//! it: every capability containerd itself holds, no masked or read-only
//! paths, a writable `/sys`, and a node in its own `/dev` tmpfs for every
//! device the host's `/dev` holds when the container is created (and none
//! made later).

use super::caps::capabilities;
use super::image::ImageConfig;
use super::quantity::{memory_bytes, milli_cpu};
use super::strings;
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

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

/// The capabilities of this process's bounding set, which containerd gives
/// a privileged container (`WithAllCurrentCapabilities`).
fn held_caps() -> Result<Vec<String>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .context("no CapBnd in /proc/self/status")?;
    Ok(super::caps::cap_names(mask))
}

/// Every char and block device under `dir`, as containerd's `HostDevices`
/// walks the host's `/dev` (`oci/utils_unix.go` `getDevices`: the `pts`,
/// `shm`, `fd`, `mqueue`, `.lxc`, `.lxd-mounts` and `.udev` directories and
/// `console` left out), as OCI `linux.devices` entries.
fn host_devices(dir: &Path, out: &mut Vec<Value>) -> Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let meta = std::fs::symlink_metadata(entry.path())?;
        let ft = meta.file_type();
        if ft.is_dir() {
            let skip = ["pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"];
            if !skip.iter().any(|s| name == *s) {
                host_devices(&entry.path(), out)?;
            }
            continue;
        }
        if name == "console" {
            continue;
        }
        let kind = if ft.is_char_device() {
            "c"
        } else if ft.is_block_device() {
            "b"
        } else {
            continue;
        };
        let rdev = meta.rdev();
        out.push(json!({
            "path": entry.path(),
            "type": kind,
            "major": nix::sys::stat::major(rdev),
            "minor": nix::sys::stat::minor(rdev),
            "fileMode": meta.mode() & 0o777,
            "uid": meta.uid(),
            "gid": meta.gid(),
        }));
    }
    Ok(())
}

/// The kubelet's default `terminationMessagePath`.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

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
    /// The node's ConfigMaps, for `envFrom` and `configMap` volumes.
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

    /// The directory of the pod's `configMap` volume `vol` (the `vi`th of
    /// the pod spec), projected from [`PodSandbox::config_maps`] the first
    /// time a container mounts it, as the kubelet does at the pod's first
    /// sync.
    pub(super) fn config_map_volume(&self, vol: &Value, vi: usize) -> Result<PathBuf> {
        let vname = vol["name"].as_str().unwrap_or_default();
        let what = format!("spec.template.spec.volumes[{vi}] ({vname}).configMap");
        let dir = self.volume_dir(vname);
        if !dir.exists() {
            self.project_volume(vol, &what)?;
        }
        Ok(dir)
    }

    /// Replaces (or, with `None`, deletes) the ConfigMap `name` and projects
    /// it again into each of the pod `pod`'s volumes of it, as the kubelet
    /// does at the next pod sync after the change.
    pub fn update_config_map(&mut self, pod: &Value, name: &str, cm: Option<Value>) -> Result<()> {
        self.config_maps.retain(|c| c["metadata"]["name"] != name);
        self.config_maps.extend(cm);
        for (vi, vol) in pod["volumes"].as_array().into_iter().flatten().enumerate() {
            if vol["configMap"]["name"] == name {
                let vname = vol["name"].as_str().unwrap_or_default();
                self.project_volume(
                    vol,
                    &format!("spec.template.spec.volumes[{vi}] ({vname}).configMap"),
                )?;
            }
        }
        Ok(())
    }

    /// `<pod dir>/volumes/kubernetes.io~configmap/<volume>`, as the kubelet
    /// names it.
    fn volume_dir(&self, vname: &str) -> PathBuf {
        self.pod_dir
            .join("volumes")
            .join("kubernetes.io~configmap")
            .join(vname)
    }

    /// Projects the ConfigMap that `vol` names into its directory.
    fn project_volume(&self, vol: &Value, what: &str) -> Result<()> {
        let cm_name = vol["configMap"]["name"]
            .as_str()
            .with_context(|| format!("{what}.name"))?;
        ensure!(
            vol["configMap"].get("items").is_none(),
            "{what}.items: not supported here"
        );
        let cm = self
            .config_maps
            .iter()
            .find(|cm| cm["metadata"]["name"] == cm_name);
        let mode = vol["configMap"]["defaultMode"].as_u64().map(|m| m as u32);
        super::config_map::project(
            &self.volume_dir(vol["name"].as_str().unwrap_or_default()),
            cm,
            vol["configMap"]["optional"] == true,
            mode,
            what,
        )
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
        let privileged = sc["privileged"] == true;

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
        let caps = if privileged {
            held_caps()?
        } else {
            capabilities(sc, &format!("{field}.securityContext"))?
        };
        let no_new_privs = sc["allowPrivilegeEscalation"] == false;
        let read_only_root = sc["readOnlyRootFilesystem"] == true;

        let mut mounts = self.mounts(pod, container, field, read_only_root)?;

        let mut resources = resources(container, field)?;
        let mut devices = Vec::new();
        if privileged {
            // `WithWriteableSysfs`, `WithAllDevicesAllowed`, `WithHostDevices`.
            for m in &mut mounts {
                if m["type"] == "sysfs"
                    && let Some(opts) = m["options"].as_array_mut()
                {
                    opts.retain(|o| o != "ro");
                }
            }
            resources["devices"] = json!([{"allow": true, "access": "rwm"}]);
            host_devices(Path::new("/dev"), &mut devices)?;
        }
        let (masked, readonly): (&[&str], &[&str]) = if privileged {
            (&[], &[])
        } else {
            (&MASKED_PATHS, &READONLY_PATHS)
        };

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
                "maskedPaths": masked,
                "readonlyPaths": readonly,
                "cgroupsPath": cgroup,
                "resources": resources,
                "devices": devices,
            },
        }))
    }
}
