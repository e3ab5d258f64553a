//! What an uninstall removes from the node: our macvtaps left in the host's
//! namespace (free or leaked: a link a pod holds sits in the pod's
//! namespace), the daemon's record, and the CNI binary with its node
//! settings, the last two only when no pod holds one of our devices
//! (their pods' DEL still runs the CNI). The daemon runs this as it exits
//! when its DaemonSet was deleted ([`crate::operator::owner`]).

use super::ledger::record_file;
use macvtap_link::{CNI_SETTINGS_FILE, Links, parse_link_name};
use std::path::{Path, PathBuf};

/// What pods hold of our devices, as the kubelet's PodResources said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// This many devices are held by pods.
    Devices(usize),
    /// The kubelet could not be asked (why).
    Unknown(String),
}

/// What [`clean_node`] did and left.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Cleaned {
    /// Our macvtaps deleted from the host's namespace.
    pub links: Vec<String>,
    /// Links that could not be deleted, with the error.
    pub links_failed: Vec<(String, String)>,
    /// Files and directories removed.
    pub removed: Vec<PathBuf>,
    /// What was kept, and why, one sentence each.
    pub kept: Vec<String>,
}

/// Removes from the node what an install of ours left there: the macvtaps
/// of ours on `links` (the host's namespace), the record directory under
/// `plugin_dir`, and, in `cni_dir` (when given), the CNI binary `cni_name`
/// and its settings file, unless `held` says pods hold our devices or
/// cannot say.
pub(crate) fn clean_node(
    links: &dyn Links,
    plugin_dir: &Path,
    cni_dir: Option<&Path>,
    cni_name: &str,
    held: &Held,
) -> Cleaned {
    let mut out = Cleaned::default();
    match links.list_links() {
        Ok(list) => {
            for l in list
                .iter()
                .filter(|l| l.is_macvtap() && parse_link_name(&l.name).is_some())
            {
                match links.del_link(l.index, &l.name) {
                    Ok(()) => out.links.push(l.name.clone()),
                    Err(e) => out.links_failed.push((l.name.clone(), e.to_string())),
                }
            }
        }
        Err(e) => out.kept.push(format!(
            "the host's links could not be listed ({e}), so none was deleted"
        )),
    }

    let record = record_file::path_in(plugin_dir);
    if let Some(dir) = record.parent().filter(|d| d.exists()) {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => out.removed.push(dir.to_path_buf()),
            Err(e) => out.kept.push(format!(
                "the record {} could not be removed: {e}",
                dir.display()
            )),
        }
    }

    let Some(cni_dir) = cni_dir else {
        out.kept.push(
            "the CNI binary and its settings: no --uninstall-cni-dir names where they are".into(),
        );
        return out;
    };
    match held {
        Held::Devices(0) => {
            for name in [cni_name, CNI_SETTINGS_FILE] {
                let f = cni_dir.join(name);
                match std::fs::remove_file(&f) {
                    Ok(()) => out.removed.push(f),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => out
                        .kept
                        .push(format!("{} could not be removed: {e}", f.display())),
                }
            }
        }
        Held::Devices(n) => out.kept.push(format!(
            "the CNI binary and its settings in {}: pods still hold {n} of our devices, and their DEL runs the CNI (delete them, then remove the two files)",
            cni_dir.display()
        )),
        Held::Unknown(why) => out.kept.push(format!(
            "the CNI binary and its settings in {}: the kubelet could not say whether pods hold our devices ({why})",
            cni_dir.display()
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use macvtap_link::Kernel;
    use test_support::fake::{FakeKernel, HOST, link};

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let plugin_dir = tmp.path().join("device-plugins");
        let record = record_file::path_in(&plugin_dir);
        std::fs::create_dir_all(record.parent().unwrap()).unwrap();
        std::fs::write(&record, "{}").unwrap();
        let cni = tmp.path().join("cni-bin");
        std::fs::create_dir(&cni).unwrap();
        for f in ["macvtap", CNI_SETTINGS_FILE, "bridge"] {
            std::fs::write(cni.join(f), "x").unwrap();
        }
        (tmp, plugin_dir, cni)
    }

    #[test]
    fn an_uninstall_leaves_nothing_of_ours_when_no_pod_holds_a_device() {
        let (_tmp, plugin_dir, cni) = setup();
        let k = FakeKernel::new();
        k.insert_link(HOST, link(2, "eth0", "veth", None));
        k.insert_link(HOST, link(3, "mvt0123456789ab", "macvtap", Some(2)));
        k.insert_link(HOST, link(4, "eth0Mvp1", "macvtap", Some(2)));
        k.insert_link(HOST, link(5, "macvtap0", "macvtap", Some(2)));
        let links = k.links(None).unwrap();
        let links = links.as_ref();
        let out = clean_node(links, &plugin_dir, Some(&cni), "macvtap", &Held::Devices(0));
        assert_eq!(out.links, ["mvt0123456789ab", "eth0Mvp1"]);
        assert!(out.kept.is_empty(), "{:?}", out.kept);
        let names: Vec<String> = links
            .list_links()
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, ["eth0", "macvtap0"], "only ours are deleted");
        assert!(!record_file::path_in(&plugin_dir).parent().unwrap().exists());
        assert!(!cni.join("macvtap").exists() && !cni.join(CNI_SETTINGS_FILE).exists());
        assert!(cni.join("bridge").exists(), "another plugin is left alone");
    }

    #[test]
    fn the_cni_stays_while_pods_hold_devices_or_nobody_can_tell() {
        for held in [Held::Devices(2), Held::Unknown("no socket".into())] {
            let (_tmp, plugin_dir, cni) = setup();
            let k = FakeKernel::new();
            let links = k.links(None).unwrap();
            let out = clean_node(links.as_ref(), &plugin_dir, Some(&cni), "macvtap", &held);
            assert!(cni.join("macvtap").exists() && cni.join(CNI_SETTINGS_FILE).exists());
            assert_eq!(out.kept.len(), 1, "{held:?}: {:?}", out.kept);
            assert!(out.kept[0].contains("CNI binary"), "{:?}", out.kept);
            assert!(!record_file::path_in(&plugin_dir).exists());
        }
    }
}
