//! The CDI specs that give a prepared claim's containers their
//! `/dev/tapN`, one file per claim in the runtime's CDI directory
//! (`/var/run/cdi`, containerd 2.x and CRI-O read it by default).
//!
//! A spec is a transient one in the Container Device Interface's terms
//! (cncf-tags/container-device-interface `pkg/cdi/spec.go`
//! `GenerateTransientSpecName`): kind [`KIND`], file
//! `macvtap.network.kubevirt.io-tap_<claim UID>.json`, one CDI device per
//! DRA device named `<claim UID>_<device ID>` (which the CNI reads back
//! from PodResources, `macvtap_link::dra::device_id_of_cdi`), whose edit is the tap node
//! (path and type only: the runtime reads its major and minor from the
//! host's node when it creates the container, `fillMissingInfo` in
//! `pkg/cdi/container-edits_unix.go`, so a link re-made by heal is still
//! found). The node is owned by [`TAP_OWNER`] in the container, KubeVirt's
//! qemu user, which the runtime does not copy from the host.
//!
//! The files are also the front's record of what it prepared: each device
//! carries its device ID, resource and requests as annotations, so a
//! restarted daemon answers a prepare again, and unprepares, from them.

use crate::error::{Error, Result};
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use macvtap_link::dra::cdi_device_name;
pub use macvtap_link::dra::{CDI_KIND as KIND, cdi_device_id};

/// The CDI spec version written: the oldest that has device annotations.
pub const CDI_VERSION: &str = "0.6.0";

/// The uid and gid of the tap node in the container: KubeVirt's qemu user
/// (107), the CNI's default owner.
pub const TAP_OWNER: u32 = 107;

/// Annotation keys on each CDI device: what the device is, for a restarted
/// daemon.
const ANN_DEVICE_ID: &str = "macvtap.network.kubevirt.io/device-id";
const ANN_RESOURCE: &str = "macvtap.network.kubevirt.io/resource";
const ANN_DEVICE_NAME: &str = "macvtap.network.kubevirt.io/device-name";
const ANN_REQUESTS: &str = "macvtap.network.kubevirt.io/requests";

/// The file name prefix of our specs, before the claim UID.
const FILE_PREFIX: &str = "macvtap.network.kubevirt.io-tap_";

/// One CDI spec, the fields we write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// [`CDI_VERSION`].
    pub cdi_version: String,
    /// [`KIND`].
    pub kind: String,
    /// One per prepared device.
    pub devices: Vec<CdiDevice>,
}

/// One CDI device: a tap node and what it was prepared as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    /// `<claim UID>_<device ID>`.
    pub name: String,
    /// The device ID, resource, DRA device name and requests.
    pub annotations: BTreeMap<String, String>,
    /// The tap node.
    pub container_edits: ContainerEdits,
}

/// What the runtime adds to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// The tap node, one.
    pub device_nodes: Vec<DeviceNode>,
}

/// A device node in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// `/dev/tapN`, the same path as on the host.
    pub path: String,
    /// `c`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `rw`.
    pub permissions: String,
    /// [`TAP_OWNER`].
    pub uid: u32,
    /// [`TAP_OWNER`].
    pub gid: u32,
}

/// One prepared device as a spec records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The claim's requests it serves.
    pub request_names: Vec<String>,
    /// The resource's name (without the prefix).
    pub resource: String,
    /// `<name>Mvp<i>`.
    pub device_id: String,
    /// The DRA device name.
    pub device_name: String,
    /// The tap node, `/dev/tapN`.
    pub node: PathBuf,
}

/// Whether `uid` is safe as part of a file name and a CDI device name: a
/// Kubernetes UID is a UUID; anything else but ASCII letters, digits and
/// `-` (at most 64) is refused.
pub fn check_claim_uid(uid: &str) -> Result<()> {
    let ok = !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && uid.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(Error::Claim {
            claim: format!("with UID {}", uid.escape_debug()),
            why: "the UID is not a Kubernetes UID (letters, digits and '-')".into(),
        })
    }
}

/// The spec of claim `uid` with `devices`.
pub fn spec(uid: &str, devices: &[Prepared]) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.to_string(),
        kind: KIND.to_string(),
        devices: devices
            .iter()
            .map(|d| CdiDevice {
                name: cdi_device_name(uid, &d.device_id),
                annotations: BTreeMap::from([
                    (ANN_DEVICE_ID.to_string(), d.device_id.clone()),
                    (ANN_RESOURCE.to_string(), d.resource.clone()),
                    (ANN_DEVICE_NAME.to_string(), d.device_name.clone()),
                    (ANN_REQUESTS.to_string(), d.request_names.join(",")),
                ]),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: d.node.to_string_lossy().into_owned(),
                        kind: "c".into(),
                        permissions: "rw".into(),
                        uid: TAP_OWNER,
                        gid: TAP_OWNER,
                    }],
                },
            })
            .collect(),
    }
}

/// The devices `spec` records, or `None` if it is not one of ours in the
/// shape [`spec`] writes.
pub fn prepared(spec: &Spec) -> Option<Vec<Prepared>> {
    if spec.kind != KIND {
        return None;
    }
    spec.devices
        .iter()
        .map(|d| {
            let ann = |k: &str| d.annotations.get(k).cloned();
            let node = d.container_edits.device_nodes.first()?;
            Some(Prepared {
                request_names: ann(ANN_REQUESTS)?
                    .split(',')
                    .filter(|r| !r.is_empty())
                    .map(str::to_string)
                    .collect(),
                resource: ann(ANN_RESOURCE)?,
                device_id: ann(ANN_DEVICE_ID)?,
                device_name: ann(ANN_DEVICE_NAME)?,
                node: PathBuf::from(&node.path),
            })
        })
        .collect()
}

/// The runtime's CDI directory, opened once; every spec is written,
/// renamed, read and removed through this descriptor, never through a
/// link planted at its name.
#[derive(Debug)]
pub struct CdiDir {
    fd: File,
    path: PathBuf,
}

impl CdiDir {
    /// Opens (making it, 0755, if missing) the directory `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let op = "opening the CDI spec directory";
        match std::fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(op, path)(e)),
        }
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(op, path)(e.into()))?;
        Ok(Self {
            fd: File::from(fd),
            path: path.to_path_buf(),
        })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file_name(uid: &str) -> String {
        format!("{FILE_PREFIX}{uid}.json")
    }

    /// Writes claim `uid`'s spec: a temporary file renamed over the spec's
    /// name, so the runtime never reads half a spec.
    pub fn write(&self, uid: &str, spec: &Spec) -> Result<()> {
        check_claim_uid(uid)?;
        let name = Self::file_name(uid);
        let tmp = format!(".{name}.tmp");
        let path = self.path.join(&name);
        let op = "writing a CDI spec";
        let text = serde_json::to_vec_pretty(spec)
            .map_err(|e| Error::io(op, &path)(std::io::Error::other(e)))?;
        match unlinkat(&self.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(Error::io(op, self.path.join(&tmp))(e.into())),
        }
        let fd = openat(
            &self.fd,
            tmp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| Error::io(op, self.path.join(&tmp))(e.into()))?;
        let mut file = File::from(fd);
        let written = file
            .write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(Error::io(op, self.path.join(&tmp)))
            .and_then(|()| {
                renameat(&self.fd, tmp.as_str(), &self.fd, name.as_str())
                    .map_err(|e| Error::io(op, &path)(e.into()))
            });
        if written.is_err() {
            let _ = unlinkat(&self.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        written
    }

    /// Claim `uid`'s spec, `None` if there is none; a file that is not a
    /// regular file, or not a spec, is an error.
    pub fn read(&self, uid: &str) -> Result<Option<Spec>> {
        check_claim_uid(uid)?;
        let name = Self::file_name(uid);
        let path = self.path.join(&name);
        let op = "reading a CDI spec";
        let fd = match openat(
            &self.fd,
            name.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::io(op, &path)(e.into())),
        };
        let st = fstat(&fd).map_err(|e| Error::io(op, &path)(e.into()))?;
        if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
            return Err(Error::io(op, &path)(std::io::Error::other(
                "it is not a regular file",
            )));
        }
        let mut text = Vec::new();
        File::from(fd)
            .take(1 << 20)
            .read_to_end(&mut text)
            .map_err(Error::io(op, &path))?;
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| Error::io(op, &path)(std::io::Error::other(e)))
    }

    /// Removes claim `uid`'s spec; a missing one is no error.
    pub fn remove(&self, uid: &str) -> Result<()> {
        check_claim_uid(uid)?;
        let name = Self::file_name(uid);
        match unlinkat(&self.fd, name.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(Error::io("removing a CDI spec", self.path.join(name))(
                e.into(),
            )),
        }
    }

    /// Removes the specs of claims none of whose devices is in `held` (an
    /// uninstall's: their pods are gone, and no daemon is left to
    /// unprepare them); returns the claim UIDs removed. A spec that is not
    /// ours in shape is left.
    pub fn remove_unheld(&self, held: &std::collections::HashSet<String>) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for uid in self.claims()? {
            let Some(devices) = self.read(&uid)?.as_ref().and_then(prepared) else {
                continue;
            };
            if devices.iter().all(|d| !held.contains(&d.device_id)) {
                self.remove(&uid)?;
                removed.push(uid);
            }
        }
        Ok(removed)
    }

    /// The claim UIDs whose specs are in the directory.
    pub fn claims(&self) -> Result<Vec<String>> {
        let op = "listing the CDI spec directory";
        let dir = nix::dir::Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(op, &self.path)(e.into()))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| Error::io(op, &self.path)(e.into()))?;
            let name = entry.file_name().to_string_lossy();
            if let Some(uid) = name
                .strip_prefix(FILE_PREFIX)
                .and_then(|r| r.strip_suffix(".json"))
                .filter(|uid| check_claim_uid(uid).is_ok())
            {
                out.push(uid.to_string());
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(uid: &str) -> Spec {
        spec(
            uid,
            &[Prepared {
                request_names: vec!["container-0-request-0".into()],
                resource: "eth1".into(),
                device_id: "eth1Mvp2".into(),
                device_name: "eth1-mvp-2".into(),
                node: PathBuf::from("/dev/tap17"),
            }],
        )
    }

    #[test]
    fn a_spec_is_what_the_cdi_library_reads() {
        let v = serde_json::to_value(one("0b5e4c9a-1111-2222-3333-444455556666")).unwrap();
        assert_eq!(v["cdiVersion"], "0.6.0");
        assert_eq!(v["kind"], "macvtap.network.kubevirt.io/tap");
        let d = &v["devices"][0];
        assert_eq!(d["name"], "0b5e4c9a-1111-2222-3333-444455556666_eth1Mvp2");
        assert_eq!(
            d["containerEdits"]["deviceNodes"][0],
            serde_json::json!({"path": "/dev/tap17", "type": "c", "permissions": "rw", "uid": 107, "gid": 107})
        );
    }

    #[test]
    fn a_spec_reads_back_as_the_devices_it_records() {
        let s = one("u-1");
        let p = prepared(&s).unwrap();
        assert_eq!(p[0].device_id, "eth1Mvp2");
        assert_eq!(p[0].request_names, ["container-0-request-0"]);
        assert_eq!(p[0].node, Path::new("/dev/tap17"));
        let foreign = Spec {
            kind: "vendor.example.com/gpu".into(),
            ..s
        };
        assert_eq!(prepared(&foreign), None);
    }

    #[test]
    fn specs_are_written_read_listed_and_removed_by_claim_uid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CdiDir::open(&tmp.path().join("cdi")).unwrap();
        assert_eq!(dir.read("u-1").unwrap(), None);
        dir.write("u-1", &one("u-1")).unwrap();
        dir.write("u-2", &one("u-2")).unwrap();
        std::fs::write(tmp.path().join("cdi/other-vendor.json"), "{}").unwrap();
        assert_eq!(dir.claims().unwrap(), ["u-1", "u-2"]);
        assert_eq!(dir.read("u-1").unwrap(), Some(one("u-1")));
        let on_disk = std::fs::read(
            tmp.path()
                .join("cdi/macvtap.network.kubevirt.io-tap_u-1.json"),
        )
        .unwrap();
        assert_eq!(
            serde_json::from_slice::<Spec>(&on_disk).unwrap(),
            one("u-1")
        );
        dir.remove("u-1").unwrap();
        dir.remove("u-1").unwrap();
        assert_eq!(dir.claims().unwrap(), ["u-2"]);
    }

    #[test]
    fn only_specs_of_claims_nobody_holds_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CdiDir::open(tmp.path()).unwrap();
        dir.write("u-1", &one("u-1")).unwrap();
        let mut other = one("u-2");
        other.devices[0]
            .annotations
            .insert(ANN_DEVICE_ID.into(), "eth1Mvp3".into());
        dir.write("u-2", &other).unwrap();
        let held = std::collections::HashSet::from(["eth1Mvp3".to_string()]);
        assert_eq!(dir.remove_unheld(&held).unwrap(), ["u-1"]);
        assert_eq!(dir.claims().unwrap(), ["u-2"]);
    }

    #[test]
    fn a_link_at_a_specs_name_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CdiDir::open(&tmp.path().join("cdi")).unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(
            &target,
            tmp.path()
                .join("cdi/macvtap.network.kubevirt.io-tap_u-1.json"),
        )
        .unwrap();
        assert!(dir.read("u-1").is_err());
        dir.write("u-1", &one("u-1")).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(dir.read("u-1").unwrap(), Some(one("u-1")));
    }

    #[test]
    fn a_uid_that_could_leave_the_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CdiDir::open(tmp.path()).unwrap();
        for bad in ["", "../x", "a/b", "-x", "a b", &"a".repeat(65)] {
            assert!(dir.write(bad, &one("x")).is_err(), "{bad:?}");
            assert!(dir.remove(bad).is_err(), "{bad:?}");
        }
    }
}
