//! A container's mounts as containerd lays them out: the defaults of
//! `oci/mounts.go` (`defaultMounts`: `/proc`, a `/dev` tmpfs, `/dev/pts`,
//! `/dev/shm`, `/dev/mqueue`, read-only `/sys`), the kubelet's (volumeMounts;
//! `pkg/kubelet/kubelet_pods.go` `makeHostsMount`: the node's `/etc/hosts`
//! copied per pod, read-write, for host-network pods;
//! `pkg/kubelet/kuberuntime/kuberuntime_container.go` `makeMounts`: the
//! termination message file bound at `terminationMessagePath`), containerd's
//! own (`pkg/cri/server/container_create_linux.go` `containerMounts`:
//! `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`, `/dev/shm`), merged by
//! `pkg/cri/opts/spec_linux_opts.go` (`WithMounts`: sorted by path depth, a
//! read-only `cgroup` at `/sys/fs/cgroup`, default mounts dropped where a
//! supplied one takes the path and everything under `/dev` dropped when
//! `/dev` is supplied; binds `rbind` + `rprivate` + `ro`/`rw`). A
//! `configMap` volume is the pod's directory that [`super::config_map`]
//! projects, bound read-only.

use super::COUNTER;
use super::spec::{DEFAULT_TERMINATION_MESSAGE_PATH, PodSandbox};
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// `path` split as containerd counts depth (`orderedMounts`): `/dev` is 2,
/// `/etc/hosts` 3.
fn depth(path: &str) -> usize {
    path.trim_end_matches('/').split('/').count()
}

impl PodSandbox {
    /// The container's mounts as containerd's `WithMounts` lays them out:
    /// the defaults not taken by a supplied mount, then the supplied ones
    /// (the kubelet's volumeMounts, hosts file and termination message file,
    /// then containerd's own) sorted by path depth.
    pub(super) fn mounts(
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
            if vol.get("configMap").is_some() {
                // The kubelet mounts every configMap volume read-only.
                cri.push(Bind {
                    dst: dst.to_string(),
                    src: self.config_map_volume(vol, vi)?,
                    ro: true,
                });
                continue;
            }
            let hp = vol["hostPath"]["path"].as_str().with_context(|| {
                format!("spec.template.spec.volumes[{vi}] ({vname}): only hostPath and configMap volumes are supported here")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_path_parts_as_containerd_does() {
        assert_eq!(depth("/dev"), 2);
        assert_eq!(depth("/dev/termination-log"), 3);
        assert_eq!(depth("/var/lib/kubelet/device-plugins/"), 5);
    }
}
